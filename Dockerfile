# syntax=docker/dockerfile:1
# The scheduler and worker image of deploy/k8s/dask-example.yaml: RAPIDS (dask-cuda) with this
# package's wheel and its [nvml] extra. From the root of a checkout, with your own registry:
#   docker build -t registry.example.org/dask-influx-metrics:0.1.0 .
#   docker push registry.example.org/dask-influx-metrics:0.1.0
# RAPIDS 26.10 pins dask and distributed to 2026.7.1, inside this package's supported range
# (>= 2026.6, < 2026.9). Base tags read <RAPIDS>-cuda<CUDA major>-py<Python> (major-only CUDA
# tags since RAPIDS 25.12): pick the CUDA major your nodes' driver supports, e.g.
#   docker build --build-arg BASE=rapidsai/base:26.10-cuda13-py3.12 ...
ARG BASE=rapidsai/base:26.10-cuda12-py3.12

# The wheel, built from this checkout (only pyproject.toml, README.md and the package: .dockerignore),
# in a copy the base image's user owns (the build writes into its source tree).
FROM ${BASE} AS wheel
COPY pyproject.toml README.md /tmp/checkout/
COPY dask_influx_metrics /tmp/checkout/dask_influx_metrics
RUN cp -r /tmp/checkout /home/rapids/src \
    && pip install --no-cache-dir build==1.6.1 \
    && python -m build --wheel --outdir /home/rapids/dist /home/rapids/src

# RAPIDS' conda environment plus the wheel with [nvml]; the Dask that RAPIDS pins stays (pip keeps
# what already satisfies a requirement), which the import line shows in the build log.
FROM ${BASE}
COPY --from=wheel /home/rapids/dist /tmp/dist
# DL3013 (pin versions in pip): a wheel file built above, not a package name to pin.
# hadolint ignore=DL3013
RUN set -- /tmp/dist/*.whl && pip install --no-cache-dir "$1[nvml]" \
    && python -c "import dask, dask_cuda, dask_influx_metrics.preload, pynvml; print('dask', dask.__version__)"
# The base image's user "rapids", by number (runAsNonRoot needs one); its entrypoint and command
# stay: the entrypoint activates conda, then runs the command (the Kubernetes example's args).
USER 1001
