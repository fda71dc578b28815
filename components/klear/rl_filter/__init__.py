"""Stage 4: the RL data filter. Keeps problems a strong model solves reliably enough to give a clean signal."""
