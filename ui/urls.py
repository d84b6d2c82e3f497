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
from django.urls import URLPattern, path, re_path
from django.views.generic import RedirectView

from ui import chart_edit, charts, compare, events, logfollow, queues, studies, subscriptions, usage, views

_ID = r"[0-9]{1,19}"
_SLUG = r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}"
#: The paths served on the event loop (xmc.asgi routes them to Django's ASGI handler).
EVENT_PATHS = re.compile(rf"^/experiments(?:/{_ID})?/events$|^/experiments/{_ID}/workUnits/{_ID}/logs/follow$")

urlpatterns: list[URLPattern] = [
    path("", RedirectView.as_view(pattern_name="ui-experiments", permanent=False), name="ui-home"),
    path("login", views.SignInView.as_view(), name="ui-login"),
    path("logout", LogoutView.as_view(next_page="ui-login"), name="ui-logout"),
    path("experiments", views.experiments, name="ui-experiments"),
    path("experiments/events", events.experiments_events, name="ui-experiments-events"),
    re_path(rf"^experiments/(?P<xid>{_ID})$", views.experiment, name="ui-experiment"),
    re_path(rf"^experiments/(?P<xid>{_ID})/events$", events.experiment_events, name="ui-experiment-events"),
    re_path(rf"^experiments/(?P<xid>{_ID})/actions$", views.act, name="ui-act"),
    re_path(rf"^experiments/(?P<xid>{_ID})/compare$", compare.compare, name="ui-compare"),
    re_path(rf"^experiments/(?P<xid>{_ID})/compare/data$", compare.compare_data, name="ui-compare-data"),
    re_path(rf"^experiments/(?P<xid>{_ID})/importance$", compare.importance, name="ui-importance"),
    re_path(rf"^experiments/(?P<xid>{_ID})/studies/(?P<sid>{_ID})$", studies.study, name="ui-study"),
    re_path(rf"^experiments/(?P<xid>{_ID})/studies/(?P<sid>{_ID})/history$", studies.history, name="ui-study-history"),
    re_path(rf"^experiments/(?P<xid>{_ID})/studies/(?P<sid>{_ID})/stop$", studies.stop, name="ui-study-stop"),
    re_path(rf"^experiments/(?P<xid>{_ID})/workUnits/(?P<wid>{_ID})$", views.work_unit, name="ui-work-unit"),
    re_path(rf"^experiments/(?P<xid>{_ID})/artifacts/(?P<aid>{_ID})$", views.artifact, name="ui-artifact"),
    re_path(rf"^experiments/(?P<xid>{_ID})/workUnits/(?P<wid>{_ID})/annotate$", views.annotate, name="ui-annotate"),
    re_path(rf"^experiments/(?P<xid>{_ID})/workUnits/(?P<wid>{_ID})/logs$", views.logs_panel, name="ui-logs"),
    re_path(rf"^experiments/(?P<xid>{_ID})/workUnits/(?P<wid>{_ID})/logs/follow$", logfollow.follow,
            name="ui-logs-follow"),
    re_path(rf"^experiments/(?P<xid>{_ID})/workUnits/(?P<wid>{_ID})/logs\.txt$", views.logs_download,
            name="ui-logs-download"),
    re_path(rf"^experiments/(?P<xid>{_ID})/workUnits/(?P<wid>{_ID})/charts/(?P<chart_id>{_SLUG})/data$",
            charts.chart_data, name="ui-chart-data"),
    re_path(rf"^experiments/(?P<xid>{_ID})/workUnits/(?P<wid>{_ID})/charts/new$", chart_edit.new_chart,
            name="ui-chart-new"),
    re_path(rf"^experiments/(?P<xid>{_ID})/workUnits/(?P<wid>{_ID})/charts/(?P<chart_id>{_SLUG})/edit$",
            chart_edit.edit_chart, name="ui-chart-edit"),
    re_path(rf"^experiments/(?P<xid>{_ID})/workUnits/(?P<wid>{_ID})/metrics/data$", charts.metric_data,
            name="ui-metric-data"),
    path("dashboards", charts.dashboards, name="ui-dashboards"),
    re_path(rf"^dashboards/(?P<dashboard_id>{_SLUG})$", charts.dashboard, name="ui-dashboard"),
    re_path(rf"^experiments/(?P<xid>{_ID})/notify$", subscriptions.notify_me, name="ui-notify-me"),
    path("subscriptions", subscriptions.subscriptions, name="ui-subscriptions"),
    path("usage", usage.usage_page, name="ui-usage"),
    path("queues", queues.queues_page, name="ui-queues"),
    re_path(rf"^subscriptions/(?P<sid>{_ID})$", subscriptions.subscription, name="ui-subscription"),
    re_path(rf"^subscriptions/(?P<sid>{_ID})/actions$", subscriptions.subscription_act, name="ui-subscription-act"),
]
