"""Training: one loop (``loop``) driven by ``rl_app train`` (``run``, checked first by ``plan``) and by
each sweep trial (``trial``, a Ray Tune ``Trainable``)."""
