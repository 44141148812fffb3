"""Studies that outlive the machine they ran on: compact run records, behaviour hashes, budgeted sweeps."""
