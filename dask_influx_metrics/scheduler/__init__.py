"""Runs in the Dask scheduler: job/DAG numbering (:mod:`.jobs`), the plugin that tags
tasks and holds the session (:mod:`.plugin`), and the ``--preload`` entry (:mod:`.preload`)."""
