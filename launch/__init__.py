"""Host-side tools run from a checkout: `python -m launch push` and `python -m launch train`.

`push` tags and pushes the locally built image to ECR (or any registry); `train` builds, checks
and sends a SageMaker CreateTrainingJob request, then follows the job and its logs.
"""
