"""Placement on Ray; the only package that imports ``ray`` (``agentrl train --ray``).

Built: engine replicas as named Ray actors in one placement group, each owning its engine
server, behind one session-affine :class:`~agentrl.engines.replicas.ReplicaEngine`, with a
resource pre-check and dead replicas replaced (:mod:`agentrl.cluster.engines`). Not yet built:
trainer ranks as Ray actors (the trainer runs in the driver process), env servers as actors.
"""
