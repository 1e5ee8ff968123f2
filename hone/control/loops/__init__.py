"""The control loops, one per kind of learning: `onpolicy` (PPO), `marl` (MAPPO/IPPO), `offpolicy`
(SAC/TD3), `offline` (BC, TD3+BC, IQL, AWR, CQL and offline-to-online)."""
