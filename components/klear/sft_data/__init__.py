"""Stage 2b: SFT chat records from teacher samples, with difficulty labels and the paper's correctness policy."""
