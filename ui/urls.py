"""The researcher's pages, at the site root: exactly the URLs the xmanager client prints.

``$XMANAGER_UI_URL/experiments/<xid>`` and ``.../workUnits/<wid>`` (the
client's launch output and its artifact links). Mounted through
``xmc.api.extensions.register_site`` from ``ui.apps.UiConfig.ready``. The
``.../events`` and ``.../logs/follow`` paths are async views that ``xmc.asgi`` sends to Django's
ASGI handler (`EVENT_PATHS`); everything else runs on the WSGI app.
"""
from __future__ import annotations

import re

from django.contrib.auth.views import LogoutView
from django.urls import URLPattern, path
from django.views.generic import RedirectView

from core import names
from ui import chart_edit, charts, compare, events, logfollow, queues, studies, subscriptions, usage, views

names.register_converters()  # <id:...> (core.names.IdConverter) and <slug_id:...>: ids spelled once
_ID = names.IdConverter.regex
#: The paths served on the event loop (xmc.asgi routes them to Django's ASGI handler).
EVENT_PATHS = re.compile(rf"^/experiments(?:/{_ID})?/events$|^/experiments/{_ID}/workUnits/{_ID}/logs/follow$")

urlpatterns: list[URLPattern] = [
    path("", RedirectView.as_view(pattern_name="ui-experiments", permanent=False), name="ui-home"),
    path("login", views.SignInView.as_view(), name="ui-login"),
    path("logout", LogoutView.as_view(next_page="ui-login"), name="ui-logout"),
    path("experiments", views.experiments, name="ui-experiments"),
    path("experiments/events", events.experiments_events, name="ui-experiments-events"),
    path("experiments/<id:xid>", views.experiment, name="ui-experiment"),
    path("experiments/<id:xid>/events", events.experiment_events, name="ui-experiment-events"),
    path("experiments/<id:xid>/actions", views.act, name="ui-act"),
    path("experiments/<id:xid>/compare", compare.compare, name="ui-compare"),
    path("experiments/<id:xid>/compare/data", compare.compare_data, name="ui-compare-data"),
    path("experiments/<id:xid>/importance", compare.importance, name="ui-importance"),
    path("experiments/<id:xid>/studies/<id:sid>", studies.study, name="ui-study"),
    path("experiments/<id:xid>/studies/<id:sid>/history", studies.history, name="ui-study-history"),
    path("experiments/<id:xid>/studies/<id:sid>/stop", studies.stop, name="ui-study-stop"),
    path("experiments/<id:xid>/workUnits/<id:wid>", views.work_unit, name="ui-work-unit"),
    path("experiments/<id:xid>/artifacts/<id:aid>", views.artifact, name="ui-artifact"),
    path("experiments/<id:xid>/workUnits/<id:wid>/annotate", views.annotate, name="ui-annotate"),
    path("experiments/<id:xid>/workUnits/<id:wid>/logs", views.logs_panel, name="ui-logs"),
    path("experiments/<id:xid>/workUnits/<id:wid>/logs/follow", logfollow.follow, name="ui-logs-follow"),
    path("experiments/<id:xid>/workUnits/<id:wid>/logs.txt", views.logs_download, name="ui-logs-download"),
    path("experiments/<id:xid>/workUnits/<id:wid>/charts/<slug_id:chart_id>/data", charts.chart_data,
         name="ui-chart-data"),
    path("experiments/<id:xid>/workUnits/<id:wid>/charts/new", chart_edit.new_chart, name="ui-chart-new"),
    path("experiments/<id:xid>/workUnits/<id:wid>/charts/<slug_id:chart_id>/edit", chart_edit.edit_chart,
         name="ui-chart-edit"),
    path("experiments/<id:xid>/workUnits/<id:wid>/metrics/data", charts.metric_data, name="ui-metric-data"),
    path("dashboards", charts.dashboards, name="ui-dashboards"),
    path("dashboards/<slug_id:dashboard_id>", charts.dashboard, name="ui-dashboard"),
    path("experiments/<id:xid>/notify", subscriptions.notify_me, name="ui-notify-me"),
    path("subscriptions", subscriptions.subscriptions, name="ui-subscriptions"),
    path("usage", usage.usage_page, name="ui-usage"),
    path("queues", queues.queues_page, name="ui-queues"),
    path("subscriptions/<id:sid>", subscriptions.subscription, name="ui-subscription"),
    path("subscriptions/<id:sid>/actions", subscriptions.subscription_act, name="ui-subscription-act"),
]
