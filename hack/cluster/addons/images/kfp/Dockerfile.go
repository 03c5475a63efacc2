# One of KFP's or Argo's Go services (hack/cluster/addons/kfp.sh): the static binary in /bin over
# the node's busybox (upstream's alpine and Debian images give their start commands a shell), with
# the API server's config folder and the time zone database the ScheduledWorkflow controller's
# cron schedules read (both empty for the others). The start command (upstream Dockerfile's CMD or
# ENTRYPOINT) is appended by the script.
ARG BUSYBOX=gpupipe.local/busybox:1.35.0
FROM ${BUSYBOX}
COPY bin/ /bin/
COPY config/ /config/
COPY zoneinfo/ /usr/share/zoneinfo/
# /tmp (mode 1777): ADD unpacks a tar with its modes; COPY would not.
ADD tmp.tar /
# Upstream's defaults for the variables the start commands read.
ENV LOG_LEVEL=info NAMESPACE="" TTL_SECONDS_AFTER_WORKFLOW_FINISH=86400 NUM_WORKERS=2 \
    EXECUTIONTYPE=Workflow
# The API server's /healthz reports them (the UI's sidebar shows "Version: <tag>"): upstream's
# backend/Dockerfile stamps them from build arguments (kfp.sh gives them to the API server's).
ARG TAG_NAME=unknown
ARG COMMIT_SHA=unknown
ENV TAG_NAME=${TAG_NAME} COMMIT_SHA=${COMMIT_SHA}
USER 65532:65532
