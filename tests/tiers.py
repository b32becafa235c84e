"""The suite's two tiers. The default one (the README's test command) keeps within ~15 minutes on
two CPU cores and runs one case of each slow end-to-end family; ATGRPO_FULL_SUITE=1 runs the
other cases too (before a release, or when touching what they cover)."""
import os

FULL = os.environ.get("ATGRPO_FULL_SUITE") == "1"
