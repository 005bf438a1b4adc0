"""The worker-agent link: the files a host's workers and its sampling agent share in the session's run
folder (:mod:`.runfolder`): each worker's task snapshot (:mod:`.snapshot`, over :mod:`.seqlock` buffers),
its outbox (:mod:`.outbox`) and the agent's beat.
"""
