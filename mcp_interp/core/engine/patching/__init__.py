"""Activation patching: the exact sweeps (generic, Llama suffix, remote edits), the one patching job, its first-order
estimate, the minimal pairs it starts from and answers of several tokens as teacher-forced rows."""
