import sys

from atgrpo_jax.plan.cli import main

sys.exit(main(sys.argv))
