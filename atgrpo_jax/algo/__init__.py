"""AT-GRPO algorithm: groups, advantages, filters, the clipped loss."""
