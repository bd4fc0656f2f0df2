#!/bin/sh
# The image's entry point (behind tini, which reaps zombies as PID 1).
# SageMaker starts the image as `docker run IMAGE train`; any other command runs as given,
# so `docker run IMAGE horovodrun --check-build` works too.
#
# With no command at all: inside a SageMaker-shaped container (the platform's or an SDK's local
# mode wrote /opt/ml/input/config/resourceconfig.json) run `train`, as SDK v3's local mode
# (ModelTrainer, Mode.LOCAL_CONTAINER) starts the image with no command; anywhere else (a
# developer's `docker run IMAGE`) print the usage and exit 64.
set -e

if [ "$#" -eq 0 ]; then
    resource_config="${SM_HVD_ML_ROOT:-/opt/ml}/input/config/resourceconfig.json"
    if [ -f "$resource_config" ]; then
        echo "docker-entrypoint: no command; $resource_config exists: running train" >&2
        exec train
    fi
    cat >&2 <<'USAGE'
usage: docker run IMAGE train             run the training job (the SageMaker contract)
       docker run IMAGE serve             serve /opt/ml/model on port 8080 (endpoints, batch transform)
       docker run IMAGE COMMAND [ARG...]  run any other command in the image
With no command, the image runs `train` when /opt/ml/input/config/resourceconfig.json exists
(a training job, e.g. the SageMaker Python SDK v3's local mode).
USAGE
    exit 64 # EX_USAGE
fi

exec "$@"
