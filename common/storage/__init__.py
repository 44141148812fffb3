"""What a run keeps on disk: crash-safe signed files, memory-mapped pages, the run folder."""
