"""`mindmotor certs`: the cluster CA, the worker CA and per-service certificates for mutual TLS
(docs/security.md).

    mindmotor certs init --dir pki
    mindmotor certs issue --dir pki --name controller --role controller --host 10.0.0.2
    mindmotor certs issue --dir pki --name worker-a --role worker --host 10.0.0.5   # one per worker instance
    mindmotor certs worker-ca --dir pki [--out DIR] [--days 365]                     # for a Deployer
    mindmotor certs show pki/worker-a.pem

`issue` writes DIR/NAME.pem and DIR/NAME-key.pem (0600); a service takes them with
`--tls-ca DIR/ca.pem --tls-cert DIR/NAME.pem --tls-key DIR/NAME-key.pem`. Roles: controller,
worker, coordinator, deployer, trainer, admin (the operator's command-line tools). A worker's NAME
is its instance id (the controller lets it act on that instance only). `worker-ca` writes
worker-ca.pem and worker-ca-key.pem (0600): an intermediate below the cluster CA that can certify
workers only, with which a Deployer (`--worker-ca-cert/--worker-ca-key`) gives each local replica
its own certificate.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("certs", help="make the cluster CA and service certificates (mutual TLS)",
                                   description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="certs_command", metavar="COMMAND", required=True)

    init = commands.add_parser("init", help="make the cluster CA (kept if there is one)")
    init.add_argument("--dir", required=True, help="where the CA lives (ca.pem, ca-key.pem)")
    init.add_argument("--days", type=int, default=3650, help="CA validity (default: %(default)s)")
    init.add_argument("--force", action="store_true", help="replace an existing CA (every certificate must be re-issued)")
    init.set_defaults(func=run_init)

    issue = commands.add_parser("issue", help="issue a certificate for one service")
    issue.add_argument("--dir", required=True, help="the CA's directory")
    issue.add_argument("--name", required=True, help="the service's name (in the certificate: mindmotor://ROLE/NAME)")
    issue.add_argument("--role", required=True,
                       choices=("controller", "worker", "coordinator", "deployer", "trainer", "admin"))
    issue.add_argument("--host", action="append", default=None, metavar="H",
                       help="a DNS name or IP address the service is dialed at; repeatable "
                            "(default: localhost, 127.0.0.1, ::1 and this host's name)")
    issue.add_argument("--days", type=int, default=365, help="validity (default: %(default)s)")
    issue.add_argument("--out", default=None, help="where to write NAME.pem and NAME-key.pem (default: --dir)")
    issue.set_defaults(func=run_issue)

    wca = commands.add_parser("worker-ca", help="make the worker CA a Deployer issues its replicas' certificates with")
    wca.add_argument("--dir", required=True, help="the cluster CA's directory")
    wca.add_argument("--out", default=None, help="where to write worker-ca.pem and worker-ca-key.pem (default: --dir)")
    wca.add_argument("--days", type=int, default=365, help="validity (default: %(default)s)")
    wca.set_defaults(func=run_worker_ca)

    show = commands.add_parser("show", help="print a certificate's identity, hosts and validity")
    show.add_argument("cert")
    show.set_defaults(func=run_show)


def run_init(args: argparse.Namespace) -> int:
    from .certs import CertError, init_ca

    if args.days < 1:
        print("error: --days must be at least 1", file=sys.stderr)
        return 2
    try:
        paths = init_ca(args.dir, days=args.days, force=args.force)
    except (CertError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"cluster CA: {paths.cert} (key {paths.key}, mode 0600)")
    return 0


def run_issue(args: argparse.Namespace) -> int:
    from .certs import CertError, default_hosts, issue

    if args.days < 1:
        print("error: --days must be at least 1", file=sys.stderr)
        return 2
    try:
        paths = issue(args.dir, args.name, args.role, hosts=args.host or default_hosts(), days=args.days, out=args.out)
    except (CertError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"mindmotor://{args.role}/{args.name}: --tls-ca {paths.ca} --tls-cert {paths.cert} --tls-key {paths.key}")
    return 0


def run_worker_ca(args: argparse.Namespace) -> int:
    from .certs import CertError, init_worker_ca

    if args.days < 1:
        print("error: --days must be at least 1", file=sys.stderr)
        return 2
    try:
        paths = init_worker_ca(args.dir, out=args.out, days=args.days)
    except (CertError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"worker CA (certifies mindmotor://worker/* only): mindmotor deployer --worker-ca-cert {paths.cert} "
          f"--worker-ca-key {paths.key} --tls-ca {paths.ca} ...")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from cryptography import x509

    from .certs import identity_of

    try:
        pem = open(args.cert, "rb").read()
        cert = x509.load_pem_x509_certificate(pem)
    except (OSError, ValueError) as exc:
        print(f"error: cannot read a certificate from {args.cert}: {exc}", file=sys.stderr)
        return 1
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        hosts = [str(h) for h in sans.get_values_for_type(x509.DNSName) + sans.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        hosts = []
    print(f"identity: {identity_of(pem) or '(none)'}")
    print(f"issuer:   {cert.issuer.rfc4514_string()}")
    for extra in x509.load_pem_x509_certificates(pem)[1:]:
        print(f"chain:    {extra.subject.rfc4514_string()} (issued by {extra.issuer.rfc4514_string()})")
    print(f"hosts:    {', '.join(hosts) or '(none)'}")
    print(f"valid:    {cert.not_valid_before_utc:%Y-%m-%d %H:%M} .. {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    return 0
