import logging, asyncio, sys
sys.path.insert(0, "/work/main/tests/agents")
from test_hosted_provider import *  # noqa
def test_probe(server, caplog):
    caplog.set_level(logging.DEBUG)
    complete(Gateway(), fake_model(server))
    names = {r.name for r in caplog.records}
    print("LOGGERS", sorted(names))
    print([r.getMessage()[:200] for r in caplog.records if r.name.startswith(("openai","httpx"))][:4])
