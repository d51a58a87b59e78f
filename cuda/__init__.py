"""The proving core: a Goldilocks NTT + Merkle commitment on the GPU (PyCUDA) and its NumPy twin."""

from flightrec.cuda.proof import ProofParams, prove

__all__ = ["ProofParams", "prove"]
