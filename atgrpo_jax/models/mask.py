"""Which keys each query may see, kept as per-token vectors instead of a [T, S] matrix.

A `Mask` is small (O(T + S)) and any block of it can be built on demand: the
einsum backend builds it whole, the blockwise one a block at a time, and the
kernels translate it to their own terms (causal flag, segment ids, lengths).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Mask(NamedTuple):
    """Query t (cache slot `q_slots[t]`) may see key slot s when s <= q_slots[t], the key is
    valid, and, for packed rows (`segments`), the key is in segment 0 (the row's shared
    prompt) or in the query's own segment; segment -1 is padding and seen by nobody."""

    q_slots: jax.Array  # [T] int
    k_valid: jax.Array  # [B, S] bool
    q_segments: jax.Array | None = None  # [B, T] int
    k_segments: jax.Array | None = None  # [B, S] int

    @classmethod
    def causal(cls, q_slots, k_valid) -> "Mask":
        return cls(jnp.asarray(q_slots), jnp.asarray(k_valid, bool))

    @classmethod
    def packed(cls, segments) -> "Mask":
        """Rows of one prompt (segment 0) followed by responses to it (1, 2, ...)."""
        return cls(jnp.arange(segments.shape[1]), segments >= 0, segments, segments)

    def block(self, q_idx, k_idx):
        """[B, len(q_idx), len(k_idx)] bool for the given query and key positions."""
        allowed = (k_idx[None, :] <= self.q_slots[q_idx][:, None])[None] & self.k_valid[:, k_idx][:, None, :]
        if self.k_segments is not None:
            keys, queries = self.k_segments[:, k_idx][:, None, :], self.q_segments[:, q_idx][:, :, None]
            allowed &= (keys == 0) | (keys == queries)
        return allowed

    def dense(self):
        """[B, T, S] bool."""
        return self.block(jnp.arange(self.q_slots.shape[0]), jnp.arange(self.k_valid.shape[1]))

    def pad(self, t: int, s: int) -> "Mask":
        """The same mask over t >= T queries and s >= S keys; the added keys are invalid."""
        dt, ds = t - self.q_slots.shape[0], s - self.k_valid.shape[1]
        q_slots = jnp.pad(self.q_slots, (0, dt))
        k_valid = jnp.pad(self.k_valid, ((0, 0), (0, ds)))
        if self.k_segments is None:
            return Mask(q_slots, k_valid)
        return Mask(q_slots, k_valid, jnp.pad(self.q_segments, ((0, 0), (0, dt)), constant_values=-1),
                    jnp.pad(self.k_segments, ((0, 0), (0, ds)), constant_values=-1))
