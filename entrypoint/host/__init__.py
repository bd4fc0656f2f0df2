"""What runs on each host beside the job's processes: its probes and readers."""
