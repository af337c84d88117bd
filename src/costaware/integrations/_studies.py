"""Optuna studies read back from their storage, for :func:`costaware.report`.

Kept apart from :mod:`costaware.integrations.optuna` so that reading a study imports
Optuna alone, not the cost model and torch. Raises ``ImportError`` without Optuna.
"""

from __future__ import annotations

import optuna

__all__ = ["journal", "load_study", "study_names"]


def study_names(storage: str | optuna.storages.BaseStorage) -> list[str]:
    """The names of the studies in ``storage`` (a database URL, or a storage object)."""
    return list(optuna.get_all_study_names(storage=storage))


def load_study(storage: str | optuna.storages.BaseStorage, name: str) -> optuna.Study:
    """The study ``name`` in ``storage``."""
    return optuna.load_study(study_name=name, storage=storage)


def journal(path: str) -> optuna.storages.JournalStorage:
    """The Optuna storage of the journal file ``path`` (``JournalFileBackend``)."""
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(path))
