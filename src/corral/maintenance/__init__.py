"""Maintenance loops that keep a store healthy: small, independent, one
leader at a time across the fleet."""

from corral.maintenance.sweeper import Sweeper

__all__ = ["Sweeper"]
