"""STUB (not from SGLang): the two URL helpers ``sglang.benchmark.serving`` imports from
``sglang/srt/utils/network.py``, reduced to their IPv4 behaviour (the originals format IPv6 hosts
through a NetworkAddress class)."""


def resolve_base_url(base_url: str, host: str, port: int) -> str:
    return base_url or f"http://{host}:{port}"


def resolve_host_port(base_url: str, host: str, port: int) -> str:
    return base_url or f"{host}:{port}"
