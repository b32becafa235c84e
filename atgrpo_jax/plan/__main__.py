import sys

from atgrpo_jax.plan.command import main

sys.exit(main(sys.argv))
