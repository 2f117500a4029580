"""Scheduling policies: static, dynamic, continuous and hybrid batching behind one interface."""
