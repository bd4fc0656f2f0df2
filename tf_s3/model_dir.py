"""A model_dir on a bucket that does not exist fails the job at start, in one line naming it.

Without this, the first write of a TensorFlow program fails deep in a rank with tensorflow-io's
"NoSuchBucket: The specified bucket does not exist", which names no path. AWS's TensorFlow
containers look model_dir's bucket up before the script starts too (sagemaker-tensorflow-
training-toolkit, s3_utils.configure: get_bucket_location). Only a definite "no such bucket"
fails the job: a denied or unreachable lookup (a role that may write objects but not list the
bucket, a network without an S3 route) says nothing about the bucket and is let through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from urllib.parse import urlparse

from smcommon.names import MODEL_DIR_PARAM

# The answers that mean the bucket does not exist (HeadBucket's 404, other calls' code).
_MISSING = frozenset({"404", "NoSuchBucket"})
# Bounded: the check must not delay a job whose network has no route to S3 by much.
_TIMEOUT_S = 5


def s3_bucket(url: str) -> str | None:
    """The bucket of an s3:// URL, else None."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        return None
    return parsed.netloc


def missing_bucket_message(
    name: str, url: str, error_code: Callable[[str], str | None]
) -> str | None:
    """One line if `url`'s bucket definitely does not exist; `error_code(bucket)` looks the
    bucket up and returns S3's error code, or None when it exists or the answer says nothing."""
    bucket = s3_bucket(url)
    if bucket is None:
        return None
    code = error_code(bucket)
    if code in _MISSING:
        return f"hyperparameter {name}={url}: S3 bucket {bucket!r} does not exist (NoSuchBucket)"
    return None


def head_bucket_error_code(env: Mapping[str, str]) -> Callable[[str], str | None]:
    """S3's HeadBucket, through boto3 with the endpoint TensorFlow's S3 plugin uses
    (S3_ENDPOINT, else boto3's own AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL)."""
    import boto3  # noqa: PLC0415 (only for jobs with an s3:// model_dir)
    import botocore.config  # noqa: PLC0415
    import botocore.exceptions  # noqa: PLC0415

    def error_code(bucket: str) -> str | None:
        client = boto3.client(
            "s3",
            endpoint_url=env.get("S3_ENDPOINT") or None,
            region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            config=botocore.config.Config(
                connect_timeout=_TIMEOUT_S, read_timeout=_TIMEOUT_S, retries={"max_attempts": 1}
            ),
        )
        try:
            client.head_bucket(Bucket=bucket)
        except botocore.exceptions.ClientError as error:
            return str(error.response.get("Error", {}).get("Code"))
        except botocore.exceptions.BotoCoreError:
            return None
        return None

    return error_code


def check_model_dir(hyperparameters: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    """The entry point's check for every job (registered in pyproject.toml): an s3:// model_dir
    on a bucket that does not exist is one line at start, not a failure deep in a rank."""
    model_dir = hyperparameters.get(MODEL_DIR_PARAM, "")
    if not model_dir.startswith("s3://"):
        return None
    return missing_bucket_message(MODEL_DIR_PARAM, model_dir, head_bucket_error_code(env))
