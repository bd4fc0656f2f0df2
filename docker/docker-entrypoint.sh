#!/bin/sh
# The image's entry point (behind tini, which reaps zombies as PID 1).
# SageMaker starts the image as `docker run IMAGE train`; any other command runs as given,
# so `docker run IMAGE horovodrun --check-build` works too.
set -e

if [ "$#" -eq 0 ]; then
    cat >&2 <<'USAGE'
usage: docker run IMAGE train             run the training job (the SageMaker contract)
       docker run IMAGE serve             serve /opt/ml/model on port 8080 (endpoints, batch transform)
       docker run IMAGE COMMAND [ARG...]  run any other command in the image
USAGE
    exit 64 # EX_USAGE
fi

exec "$@"
