"""Every gRPC server and channel of the platform, made here: mutual TLS from the cluster CA, or a
cluster token in call metadata, or (loopback only) open; the same keepalive and ping policy on
both ends; one interceptor that authenticates and authorizes every RPC by role.

    configure(security_from_args(args))                   # once per process (CLIs; else the environment)
    server, port = make_server(host, port, WORKER_POLICY, registry=metrics.registry)
    channel = aio_channel("10.0.0.5:50051")              # grpc.aio; channel(...) is the blocking one
    caller = current_caller()                              # inside a handler: who is calling (Caller)

Settings (flags on every service, the environment otherwise):
    --tls-ca/--tls-cert/--tls-key     MINDMOTOR_TLS_CA / _CERT / _KEY      mutual TLS (all three)
    --cluster-token-file              MINDMOTOR_CLUSTER_TOKEN_FILE or MINDMOTOR_CLUSTER_TOKEN
A client sends the token (metadata `x-mindmotor-cluster-token`) whenever it has one.

Who a caller is: under mutual TLS the `mindmotor://ROLE/NAME` of its certificate (the handshake
already refused certificates not from the cluster CA, expired ones, and none at all; a role other
than worker only from a certificate the root CA signed itself: `certs.peer_identity`); with a
token, a cluster member (any role but deployer/admin when an admin token guards those) at its
peer address; open, the same without a credential. The admin bearer token (`--admin-token`,
metadata `authorization: Bearer`) adds the admin role in every mode. Health checks stay open.
Refusals: UNAUTHENTICATED (no or a wrong credential), PERMISSION_DENIED (the wrong role), each
counted in `mindmotor_rpc_refused_total{method,code}`.
"""

from __future__ import annotations

import contextvars
import functools
import hmac
import inspect
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import grpc

from .admin_token import bearer_matches
from .certs import ROLES, CertError, Identity, peer_identity, verify_peer
from .exposure import is_loopback
from .redact import register_secret
from .rpc_args import ENV_CA, ENV_CERT, ENV_KEY, ENV_TOKEN, ENV_TOKEN_FILE, add_arguments  # noqa: F401

log = logging.getLogger("mindmotor.rpc")

TOKEN_HEADER = "x-mindmotor-cluster-token"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
REFLECTION_PREFIX = "/grpc.reflection."

# ---- keepalive: one policy for both ends -------------------------------------------------------
# A client pings an idle connection every CLIENT_KEEPALIVE_MS (to notice a peer that vanished); a
# server accepts pings without calls and no more often than SERVER_MIN_PING_MS, which must not be
# above the clients' interval, or the server counts each ping a strike and after MAX_PING_STRIKES
# sends GOAWAY "too_many_pings" (the "UNAVAILABLE: Too many pings" after an idle minute).
CLIENT_KEEPALIVE_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
SERVER_MIN_PING_MS = 5_000
SERVER_KEEPALIVE_MS = 30_000
MAX_PING_STRIKES = 2


def client_options(keepalive_ms: int = CLIENT_KEEPALIVE_MS, timeout_ms: int = KEEPALIVE_TIMEOUT_MS
                   ) -> list[tuple[str, int]]:
    return [("grpc.keepalive_time_ms", keepalive_ms), ("grpc.keepalive_timeout_ms", timeout_ms),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]


def server_options(min_ping_ms: int = SERVER_MIN_PING_MS, keepalive_ms: int = SERVER_KEEPALIVE_MS,
                   timeout_ms: int = KEEPALIVE_TIMEOUT_MS, max_strikes: int = MAX_PING_STRIKES
                   ) -> list[tuple[str, int]]:
    return [("grpc.keepalive_time_ms", keepalive_ms), ("grpc.keepalive_timeout_ms", timeout_ms),
            ("grpc.http2.min_ping_interval_without_data_ms", min_ping_ms),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_ping_strikes", max_strikes)]


def _merge(base: list[tuple[str, object]], extra: Iterable[tuple[str, object]]) -> list[tuple[str, object]]:
    """`extra` wins over `base` for the same option."""
    merged = dict(base)
    merged.update(dict(extra))
    return list(merged.items())


# ---- settings ---------------------------------------------------------------------------------


class RpcSettingsError(ValueError):
    """Incomplete or unreadable TLS settings, an empty token, credentials missing off loopback."""


@dataclass(frozen=True)
class RpcSecurity:
    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    cert_path: str | None = field(default=None, compare=False)   # the files, for the HTTP side ports
    key_path: str | None = field(default=None, compare=False)    # (common/https_side.py)

    @property
    def tls(self) -> bool:
        """TLS (a client without a certificate of its own still verifies the server's)."""
        return self.ca is not None or self.cert is not None

    @property
    def mode(self) -> str:
        return "mtls" if self.tls else ("token" if self.token else "open")

    @classmethod
    def load(cls, ca: str | None = None, cert: str | None = None, key: str | None = None,
             token_file: str | None = None, token: str | None = None) -> "RpcSecurity":
        given = [bool(ca), bool(cert), bool(key)]
        if any(given) and not all(given):
            raise RpcSettingsError("mutual TLS needs all of --tls-ca, --tls-cert and --tls-key "
                                   f"({ENV_CA}, {ENV_CERT}, {ENV_KEY})")
        if token_file:
            token = _read(token_file, "cluster token file").decode().strip()
            if not token:
                raise RpcSettingsError(f"the cluster token file {token_file} is empty")
        if token is not None and not token.strip():
            token = None
        files = [_read(p, name) for p, name in ((ca, "TLS CA"), (cert, "TLS certificate"), (key, "TLS key"))] \
            if all(given) else [None, None, None]
        if all(given):
            _check_pair(*files, cert_path=cert)
        if token:
            register_secret(token.strip())          # masked in every log line of this process
        return cls(*files, token=token.strip() if token else None,
                   cert_path=cert if all(given) else None, key_path=key if all(given) else None)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "RpcSecurity":
        env = os.environ if environ is None else environ
        return cls.load(env.get(ENV_CA) or None, env.get(ENV_CERT) or None, env.get(ENV_KEY) or None,
                        env.get(ENV_TOKEN_FILE) or None, env.get(ENV_TOKEN) or None)


def _check_pair(ca: bytes, cert: bytes, key: bytes, cert_path: str) -> None:
    """A clear error at start for a certificate its own cluster would refuse, or an unreadable key."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    problem = verify_peer(cert, ca)
    if problem:
        raise RpcSettingsError(f"the TLS certificate {cert_path}: {problem}")
    try:
        load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as exc:
        raise RpcSettingsError(f"the TLS key is not an unencrypted PEM private key ({type(exc).__name__})") from None


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise RpcSettingsError(f"cannot read the {what} {path}: {exc.strerror}") from None


_security: RpcSecurity | None = None


def configure(security: RpcSecurity | None) -> None:
    """The process's settings (None: read the environment again on next use)."""
    global _security
    _security = security


def security() -> RpcSecurity:
    global _security
    if _security is None:
        _security = RpcSecurity.from_env()
    return _security


def security_from_args(args) -> RpcSecurity:
    """Flags where given, the environment for the rest; RpcSettingsError."""
    env = os.environ
    tls = [getattr(args, "tls_ca", None), getattr(args, "tls_cert", None), getattr(args, "tls_key", None)]
    if not any(tls):
        tls = [env.get(ENV_CA) or None, env.get(ENV_CERT) or None, env.get(ENV_KEY) or None]
    token_file = getattr(args, "cluster_token_file", None) or env.get(ENV_TOKEN_FILE) or None
    return RpcSecurity.load(*tls, token_file=token_file, token=None if token_file else env.get(ENV_TOKEN))


def configure_from_args(args) -> RpcSecurity:
    sec = security_from_args(args)
    configure(sec)
    return sec


# ---- channels ---------------------------------------------------------------------------------
class _TokenMetadata:
    """Adds the cluster token to a call's metadata (grpc.aio takes one interceptor object per
    kind of call: the four below)."""

    def __init__(self, token: str):
        self.pair = (TOKEN_HEADER, token)

    def _details(self, details):
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*self.pair)
        return details._replace(metadata=metadata)


class _UnaryUnaryToken(_TokenMetadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _UnaryStreamToken(_TokenMetadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _StreamUnaryToken(_TokenMetadata, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


class _StreamStreamToken(_TokenMetadata, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


def _token_interceptors(token: str) -> list:
    return [kind(token) for kind in (_UnaryUnaryToken, _UnaryStreamToken, _StreamUnaryToken, _StreamStreamToken)]


class _SyncTokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                            grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str):
        self.pair = (TOKEN_HEADER, token)

    def _details(self, details):
        return _SyncDetails(details.method, details.timeout, [*(details.metadata or ()), self.pair],
                            details.credentials, getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


@dataclass(frozen=True)
class _SyncDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: list
    credentials: object
    wait_for_ready: object
    compression: object


def _credentials(sec: RpcSecurity) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=sec.ca, private_key=sec.key, certificate_chain=sec.cert)


def aio_channel(address: str, options: Sequence[tuple[str, object]] = (),
                sec: RpcSecurity | None = None) -> grpc.aio.Channel:
    """A grpc.aio channel to `address` with the cluster's credentials and keepalive policy."""
    sec = sec or security()
    opts = _merge(client_options(), options)
    interceptors = _token_interceptors(sec.token) if sec.token else None
    if sec.tls:
        return grpc.aio.secure_channel(address, _credentials(sec), options=opts, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)


def channel(address: str, options: Sequence[tuple[str, object]] = (), sec: RpcSecurity | None = None) -> grpc.Channel:
    """The blocking kind (command-line tools)."""
    sec = sec or security()
    opts = _merge(client_options(), options)
    made = grpc.secure_channel(address, _credentials(sec), options=opts) if sec.tls \
        else grpc.insecure_channel(address, options=opts)
    return grpc.intercept_channel(made, _SyncTokenInterceptor(sec.token)) if sec.token else made


# ---- who is calling ---------------------------------------------------------------------------
MEMBER_ROLES = frozenset(ROLES) - {"admin"}
PRIVILEGED = frozenset({"deployer", "admin"})   # what an admin token keeps from credential-less members


@dataclass(frozen=True)
class Caller:
    kind: str                 # "cert" | "token" | "open"
    roles: frozenset[str]
    name: str                 # the certificate's name, or the peer host
    peer: str                 # host part of the peer address

    @property
    def identity(self) -> str:
        """What an instance registration is bound to: the certificate, or the peer host."""
        return f"cert:{self.name}" if self.kind == "cert" else f"addr:{self.peer}"

    def __str__(self) -> str:
        return f"{'/'.join(sorted(self.roles)) if self.kind == 'cert' else self.kind} {self.name}"


_caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("mindmotor_rpc_caller", default=None)


def current_caller() -> Caller | None:
    """The authenticated caller of the RPC being handled (None outside a handler)."""
    return _caller.get()


def peer_host(peer: str) -> str:
    """"ipv4:10.0.0.5:4321" → "10.0.0.5"; "ipv6:[::1]:4321" → "::1"."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    return rest or peer


@dataclass(frozen=True)
class Policy:
    """Which roles may call which methods of one service: `rules` maps a method name (as in the
    proto: "Drain") to roles; any other method takes `default`."""
    service: str                              # full name, e.g. "mindmotor.v1.Worker"
    default: frozenset[str]
    rules: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def allowed(self, method: str) -> frozenset[str]:
        prefix = f"/{self.service}/"
        name = method[len(prefix):] if method.startswith(prefix) else method
        return self.rules.get(name, self.default)


class Refusal(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


@functools.lru_cache(maxsize=1024)
def _certificate_identity(cert_pem: bytes, ca_pem: bytes) -> Identity:
    """`certs.peer_identity` of a handshake-verified client certificate, once per certificate (a
    signature check with the root's key: only the root issues identities other than workers)."""
    if not cert_pem:
        raise CertError("no client certificate in the TLS session")
    return peer_identity(cert_pem, ca_pem)


class Authenticator:
    """Who a call comes from (its credential checked), and whether its roles allow the method."""

    def __init__(self, sec: RpcSecurity, admin_token: str | None = None):
        self.sec = sec
        self.admin_token = admin_token

    def caller(self, context) -> Caller:
        metadata = context.invocation_metadata() or ()
        host = peer_host(context.peer() or "")
        admin = bool(self.admin_token) and bearer_matches(metadata, self.admin_token)
        if self.sec.tls:
            pem = next(iter(context.auth_context().get("x509_pem_cert") or ()), b"")
            try:
                identity = _certificate_identity(pem, self.sec.ca or b"")
            except CertError as exc:
                raise Refusal(grpc.StatusCode.UNAUTHENTICATED, str(exc)) from None
            return Caller("cert", frozenset({identity.role}) | ({"admin"} if admin else set()), identity.name, host)
        if self.sec.token:
            given = next((v for k, v in metadata if k == TOKEN_HEADER), None)
            if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.sec.token.encode()):
                raise Refusal(grpc.StatusCode.UNAUTHENTICATED,
                              f"{'wrong' if given else 'missing'} cluster token (metadata {TOKEN_HEADER})")
        kind = "token" if self.sec.token else "open"
        roles = frozenset(ROLES) - (PRIVILEGED if self.admin_token else frozenset())
        return Caller(kind, roles | ({"admin"} if admin else set()), host, host)

    def authorize(self, caller: Caller, allowed: frozenset[str], method: str) -> None:
        if caller.roles & allowed:
            return
        if caller.kind != "cert" and "admin" in allowed and self.admin_token:
            raise Refusal(grpc.StatusCode.UNAUTHENTICATED,
                          f"{method.rsplit('/', 1)[-1]} needs the admin token (metadata authorization: Bearer <token>)")
        raise Refusal(grpc.StatusCode.PERMISSION_DENIED,
                      f"{caller} may not call {method.rsplit('/', 1)[-1]} (allowed: {', '.join(sorted(allowed))})")


_refused_counters: dict[int, object] = {}


def refused_counter(registry=None):
    """`mindmotor_rpc_refused_total{method,code}` in `registry` (default: the global one), made once."""
    from prometheus_client import REGISTRY, Counter

    registry = registry or REGISTRY
    counter = _refused_counters.get(id(registry))
    if counter is None:
        counter = _refused_counters[id(registry)] = Counter(
            "mindmotor_rpc_refused", "gRPC calls refused by the cluster interceptor", ["method", "code"],
            registry=registry)
    return counter


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every handler (health checks excepted) so that it first authenticates the caller
    (`context.auth_context()`, the token) and checks the policy, then runs with `current_caller()`
    set. The wrapped handler is of the same kind as the original."""

    def __init__(self, policies: Sequence[Policy], authenticator: Authenticator, registry=None):
        self.policies = list(policies)
        self.auth = authenticator
        self.refused = refused_counter(registry)

    def _allowed(self, method: str) -> frozenset[str]:
        for policy in self.policies:
            if method.startswith(f"/{policy.service}/"):
                return policy.allowed(method)
        return frozenset({"admin"})           # a service without a policy: admins only

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(HEALTH_PREFIX) or method.startswith(REFLECTION_PREFIX):
            return handler
        return _wrap(handler, self._gate(method, self._allowed(method)))

    def _gate(self, method: str, allowed: frozenset[str]):
        async def gate(context) -> contextvars.Token:
            try:
                caller = self.auth.caller(context)
                self.auth.authorize(caller, allowed, method)
            except Refusal as refusal:
                self.refused.labels(method=method, code=refusal.code.name).inc()
                log.warning("rpc refused", extra={"method": method, "code": refusal.code.name,
                                                  "reason": refusal.message, "peer": context.peer()})
                await context.abort(refusal.code, refusal.message)
            return _caller.set(caller)
        return gate


def _wrap(handler: grpc.RpcMethodHandler, gate) -> grpc.RpcMethodHandler:
    kind = (handler.request_streaming, handler.response_streaming)
    inner = {(False, False): handler.unary_unary, (False, True): handler.unary_stream,
             (True, False): handler.stream_unary, (True, True): handler.stream_stream}[kind]
    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[kind]

    if inspect.isasyncgenfunction(inner):
        async def wrapped(request, context):
            await gate(context)
            async for item in inner(request, context):
                yield item
    else:
        async def wrapped(request, context):       # noqa: F811 — one of the two, by the handler's kind
            await gate(context)
            result = inner(request, context)
            return await result if inspect.isawaitable(result) else result

    return make(wrapped, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


# ---- servers ----------------------------------------------------------------------------------

def _all_guarded(policies: Sequence[Policy], admin_token: str | None) -> bool:
    """Whether an admin token keeps every method of these services from callers without a
    credential (the Deployer, the Trainer): then they may listen beyond loopback without TLS or a
    cluster token, the token being what `--admin-token` always was."""
    if not admin_token:
        return False
    open_roles = frozenset(ROLES) - PRIVILEGED
    return all(not (roles & open_roles) for p in policies for roles in (p.default, *p.rules.values()))


def make_server(host: str, port: int, policies: Policy | Sequence[Policy], *, admin_token: str | None = None,
                registry=None, options: Iterable[tuple[str, object]] = (), interceptors: Sequence = (),
                sec: RpcSecurity | None = None, allow_open: bool = False) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server listening on host:port (0: a free one) with the cluster's credentials,
    keepalive policy and the auth interceptor first; (server, bound port). RpcSettingsError when
    it would be open beyond loopback (unless an admin token guards every method, or `allow_open`:
    the operator's explicit `--allow-open-admin`); OSError when it cannot listen."""
    sec = sec or security()
    policies = [policies] if isinstance(policies, Policy) else list(policies)
    if sec.tls and not (sec.cert and sec.key and sec.ca):
        raise RpcSettingsError("a TLS server needs the CA, its certificate and its key")
    if sec.mode == "open" and not is_loopback(host) and not allow_open and not _all_guarded(policies, admin_token):
        raise RpcSettingsError(
            f"refusing to serve gRPC on {host}:{port} without credentials: give --tls-ca/--tls-cert/--tls-key "
            f"(mutual TLS; `mindmotor certs`) or --cluster-token-file, or bind to 127.0.0.1")
    if sec.mode == "open":
        log.warning("gRPC is open (no TLS, no cluster token): loopback only",
                    extra={"host": host, "services": [p.service for p in policies]})
    server = grpc.aio.server(
        interceptors=[AuthInterceptor(policies, Authenticator(sec, admin_token), registry), *interceptors],
        options=_merge(server_options(), options))
    address = f"{host}:{port}" if ":" not in host else f"[{host.strip('[]')}]:{port}"
    if sec.tls:
        creds = grpc.ssl_server_credentials([(sec.key, sec.cert)], root_certificates=sec.ca, require_client_auth=True)
        bound = server.add_secure_port(address, creds)
    else:
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    return server, bound


# ---- the platform's policies --------------------------------------------------------------------
ANY = frozenset(ROLES)
CONTROL = frozenset({"controller", "deployer", "admin"})

WORKER_POLICY = Policy("mindmotor.v1.Worker", default=ANY,
                       rules={"Drain": CONTROL, "SetRole": CONTROL,
                              "Recall": frozenset({"coordinator", "admin"}),
                              # the coordinator fans an admin's /v1/load_lora_adapter out to the workers
                              "LoadLoraAdapter": frozenset({"coordinator", "deployer", "admin"}),
                              "UnloadLoraAdapter": frozenset({"coordinator", "deployer", "admin"})})
CONTROLLER_POLICY = Policy("mindmotor.v1.Controller", default=frozenset({"admin"}), rules={
    "Register": frozenset({"worker"}), "Heartbeat": frozenset({"worker"}), "Deregister": frozenset({"worker", "admin"}),
    "Watch": frozenset({"coordinator", "deployer", "controller", "admin"}),
    "ReportFailure": frozenset({"coordinator", "admin"}),
    "SetTraffic": frozenset({"deployer", "admin"})})
DEPLOYER_POLICY = Policy("mindmotor.v1.Deployer", default=frozenset({"admin"}))
TRAINER_POLICY = Policy("mindmotor.v1.Trainer", default=frozenset({"admin", "deployer"}))
