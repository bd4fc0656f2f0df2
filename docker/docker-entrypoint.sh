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

# `serve` loads the built-in TensorFlow model's SavedModels: there is no TensorFlow to run them in
# the torch image.
case "${SM_IMAGE_FLAVOR:-}:$1" in
    torch*:serve)
        echo "serve: not in the torch image (it serves the TensorFlow images' SavedModels)" >&2
        exit 1
        ;;
esac

exec "$@"
