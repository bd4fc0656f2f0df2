# The image's BASH_ENV: every non-interactive bash sources this first. It acts in one case only:
# bash as PID 1 running SageMaker Python SDK v3's driver command, which v3 makes the container's
# entry point when a ModelTrainer has `source_code`:
#     /bin/bash -c "chmod +x /opt/ml/input/data/sm_drivers/sm_train.sh && .../sm_train.sh"
# That bash would be PID 1 without tini (SIGTERM dropped) and v3's drivers would run unsupervised
# (no fail-fast across hosts, no failure file, its MPI driver needs ssh keys no image may bake).
# Instead it becomes what the image's ENTRYPOINT runs, `tini -- train`; `train` reads what v3
# asked for from the sm_drivers channel and runs it as its own launch (entrypoint/sdk3.py).
# Anywhere else (any other command, any bash that is not PID 1) this does nothing.
if [ "$$" = 1 ] && [ -z "${SM_HVD_SDK3_COMMAND:-}" ]; then
    case "${BASH_EXECUTION_STRING:-}" in
        *"/opt/ml/input/data/sm_drivers/sm_train.sh"*)
            export SM_HVD_SDK3_COMMAND="$BASH_EXECUTION_STRING"
            echo "bash-env: SageMaker Python SDK v3's driver command as PID 1: running train under tini instead" >&2
            exec /usr/bin/tini -- train
            ;;
    esac
fi
