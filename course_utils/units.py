"""The byte units every module writes its figures in: MiB and GiB are the binary units (2**20 and 2**30
bytes) that PyTorch's memory counters and nvidia-smi report in."""

MiB = 1024**2
GiB = 1024**3
