# MindMotor serving image: controller, coordinator, worker, deployer and operator (one image, pick the service with
# the command: `docker run mindmotor:dev worker --help`). Serving dependencies only — no PyTorch
# (the trainer's `train` extra is not installed). The bundled demo model is package data
# (services/mindmotor/assets) and is reachable at the stable path /models/mindmotor-demo.
#
#   docker build -t mindmotor:dev .
#   docker compose up -d            # docker-compose.yml: redis, controller, coordinator, 2 workers, prometheus, grafana
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OPENBLAS_NUM_THREADS=1

WORKDIR /opt/mindmotor

# 1. The serving dependencies, read from pyproject.toml's [project].dependencies, and the
#    `operator` extra (kopf: `mindmotor operator`, deploy/kubernetes/operator) — one layer that only
#    changes when they do.
COPY pyproject.toml ./
RUN python -c "import tomllib; t = tomllib.load(open('pyproject.toml', 'rb')); print('\n'.join(t['project']['dependencies'] + t['project']['optional-dependencies']['operator']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# 2. The package itself (non-editable; the model under services/mindmotor/assets is package data),
#    then the sources are removed: the image runs the installed copy.
COPY README.md ./
COPY services ./services
RUN pip install --no-deps . \
    && rm -rf /opt/mindmotor/services /opt/mindmotor/build \
    && mkdir -p /models \
    && ln -s "$(python -c 'import pathlib, mindmotor; print(pathlib.Path(mindmotor.__file__).parent / "assets" / "mindmotor-demo")')" \
        /models/mindmotor-demo \
    && test -f /models/mindmotor-demo/tokenizer.json

# Health checks for compose (gRPC health of workers/controllers, HTTP of the coordinator).
COPY deploy/docker/healthcheck.py /usr/local/bin/mindmotor-healthcheck
RUN chmod 0755 /usr/local/bin/mindmotor-healthcheck

# Non-root: uid/gid 10001 (the Kubernetes manifests set runAsUser to the same number).
RUN groupadd --system --gid 10001 mindmotor \
    && useradd --system --uid 10001 --gid mindmotor --home-dir /home/mindmotor --create-home mindmotor
USER 10001:10001
WORKDIR /home/mindmotor

# coordinator HTTP, controller gRPC + admin HTTP, worker gRPC + Prometheus side port
EXPOSE 8000 50050 8090 50051 9100

ENTRYPOINT ["mindmotor"]
CMD ["--help"]
