"""Never runs: the job is stopped while its requirements.txt installs."""

raise SystemExit("the job should have been stopped during set-up")
