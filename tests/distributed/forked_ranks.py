"""Forked gloo ranks for distributed tests (see :mod:`dlscale.runtime.local_ranks`): each child sets torchrun's
variables, so dlscale's own launch detection and process-group start-up are what the tests exercise."""

from dlscale.runtime.local_ranks import free_port, run_ranks

__all__ = ["free_port", "run_ranks"]
