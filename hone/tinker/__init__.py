"""`hone serve tinker`: an HTTP server speaking the Tinker REST API as the `tinker` SDK (0.38.0) calls it,
so a program written against `tinker.ServiceClient` trains and samples on Hone's parts, on this machine.

`server.TinkerServer` (the HTTP side and its lifecycle), `api` (the routes), `futures` (the request queue
and its one worker), `engine` (base models, LoRA adapters, forward/backward, optimizer steps), `losses`
(the SDK's built-in losses), `sampling` (Hone's HF sampler), `store` (checkpoints and tinker:// paths),
`wire` (the SDK's protobuf messages). Needs the `tinker` extra (`pip install 'hone[tinker]'`).
"""
