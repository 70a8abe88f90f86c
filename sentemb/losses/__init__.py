"""Objectives: each takes the two views' embeddings (z, z') and returns a LossOutput."""

from sentemb.losses.base import LossOutput, Objective, cross_view_similarity, normalize
from sentemb.losses.infonce import InfoNCE

__all__ = ["InfoNCE", "LossOutput", "Objective", "cross_view_similarity", "normalize"]
