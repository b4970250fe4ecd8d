"""What the test suites share, one module per role (docs/testing.md).

`servers` serves the gateway (uvicorn in a thread, or the CLI as a child), `upstreams` the loopback
provider servers, `faults` their scripted misbehaviour, `redis` a real redis-server, `recordings` the
recorded provider bodies, `clients` what a client sends and reads back, `errors` the dialects' error
shapes, `adapters` and `eventstream` the pure adapter tests' requests and frames, `pipelines` the
in-process pipeline with injected time, `waiting` polling. Fixtures live in conftest.py files.
"""
