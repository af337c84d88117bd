"""Framework adapters (Optuna, Ray Tune, Lightning), installed as ``costaware.integrations``.

Each adapter lives in its own module and needs its framework's extra, for example
``pip install 'costaware[optuna]'``. The core package never imports these frameworks.
"""
