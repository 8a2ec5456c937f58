"""Rewards: rule functions (`functions`), the worker processes that run them with a timeout
(`runner`), a trained reward model (`model`), and the `reward` group made into one of those
(`group`). This file stays empty: a worker process imports `functions` alone."""
