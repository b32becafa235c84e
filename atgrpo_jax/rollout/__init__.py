"""The tree rollout and the agent -> policy router."""
