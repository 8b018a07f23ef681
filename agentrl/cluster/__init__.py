"""Placement on Ray; the only package that imports ``ray`` (``agentrl train --ray``).

Engine replicas as named Ray actors, each owning its engine server, behind one session-affine
:class:`~agentrl.engines.replicas.ReplicaEngine`, with a resource pre-check and dead replicas
replaced (:mod:`agentrl.cluster.engines`); env servers as CPU actors, replaced when they die
(:mod:`agentrl.cluster.envs`), both through one actor supervisor (:mod:`agentrl.cluster.supervisor`);
what one trainer process owns of them (:mod:`agentrl.cluster.parts`);
data-parallel trainer ranks as actors (:mod:`agentrl.cluster.trainers`). See docs/cluster.md.
"""
