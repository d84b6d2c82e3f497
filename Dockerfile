# The production image of every XMC process (web, grpc, workers, beat,
# reconciler): one image, the Deployment's args pick the process
# (deploy/base/). Non-root, pinned base and requirements.
FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=xmc.settings

RUN groupadd --gid 10001 xmc && useradd --uid 10001 --gid xmc --no-create-home --home-dir /app xmc

WORKDIR /app
COPY requirements.txt requirements-xmanager.txt ./
# The xmanager wheel only provides the generated cloud.xmanager.v1 modules:
# installed without its (large, unneeded) dependencies.
RUN pip install -r requirements.txt \
 && pip install --no-deps -r requirements-xmanager.txt

COPY . .
# Internal protos are generated at build time; static files are collected
# into STATIC_ROOT for WhiteNoise. Neither step reads real settings.
RUN python -c "import core.protos" \
 && XMC_DEBUG=true python manage.py collectstatic --noinput --verbosity 0 \
 && python -m compileall -q core jobsets xmc experiments workunits artifacts metrics lifecycle k8s_bridge notifications ui

USER 10001:10001
EXPOSE 8000 50051 9100
# ASGI (xmc/asgi.py): the event streams on the event loop, everything else on the
# WSGI app in a thread pool of XMC_WEB_THREADS per worker.
CMD ["gunicorn", "xmc.asgi:application", "--worker-class", "xmc.web_worker.UvicornWorker", "--bind", "0.0.0.0:8000", "--workers", "2", "--keep-alive", "75"]
