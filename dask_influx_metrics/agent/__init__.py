"""The sampling agent: one process per host, OS user and session samples every GPU, the host and each
worker process, and attributes each reading to the jobs and DAGs running where it applies."""
