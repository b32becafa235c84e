"""The suite's two tiers. The default one (the README's test command) keeps within ~15 minutes on
two CPU cores and runs one case of each slow end-to-end family; ATGRPO_FULL_SUITE=1 runs the
other cases too (before a release, or when touching what they cover): the paper config from the
command line (bf16) and its math, Sokoban and Sudoku cases, the shared asynchronous run, the
trained-alone ablation, kills during an evaluation, SIGTERM at staleness 0 and 1 and to one of two
hosts, two processes at staleness 2, a second process reading the compilation cache, every part of `bench device --tiny`, the compiled
PyTorch baselines, and the fault cases a sibling covers (a disk full at save time, no readable
checkpoint, max_skipped_updates=0, the launch preflight compiling for a TPU, a hung environment step
stopping a CLI run, a tiny search run with the real tokenizer, a mixture's training run, the role-phase
resume run, the "your own task" guide's workflow example run through its two commands)."""
import os

FULL = os.environ.get("ATGRPO_FULL_SUITE") == "1"
BUDGET_S = 12 * 60  # the default tier's wall time on two CPU cores with -n 2 (docs/design/developers.md)
SLOWEST_SHOWN = 15  # the slowest tests every run prints with its total (tests/conftest.py)
