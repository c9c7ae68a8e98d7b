"""The ingress service as a node plugs it in (``otela.services.IngressPlugin``, found
through the ``otela.ingress`` entry point); its ``otela`` subcommands are in
``ingress.commands``."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingress import admin_api, batch_api
from ingress.batch_runner import RunnerSettings
from ingress.dashboard import install as install_dashboard
from ingress.service import IngressService
from ingress.sso.off import install as install_no_sso
from ingress.sso.settings import SsoConfigError, SsoSettings
from otela.api import visibility
from otela.identity import load_or_create

if TYPE_CHECKING:
    from fastapi import FastAPI

    from otela.config import NodeConfig


def node_secret(home: Path) -> bytes:
    """The batch runner's signing secret, the same in every process of a node (its
    data-path workers check the tokens the control process's runner sends): derived from
    the node's identity key, which whoever could read it could use to impersonate the
    node anyway. Kept in memory only, never written out."""
    seed = load_or_create(home).key_pair.private_key.to_bytes()
    return hmac.new(seed, b"otela ingress batch credentials v1", hashlib.sha256).digest()


def sso_settings(config: NodeConfig) -> SsoSettings | None:
    """The dashboard's single sign-on, checked before the node opens its port: settings
    that cannot work, or the ``sso`` extra missing, stop it with a message."""
    settings = SsoSettings.from_config(config)
    if settings is not None:
        try:
            import ingress.sso.oidc  # noqa: F401  (authlib, joserfc)
        except ImportError as exc:
            raise SsoConfigError(f"sso_issuer is set but {exc.name or 'authlib'} is not "
                                 "installed: pip install 'otela[sso]'") from None
    return settings


class Plugin:
    def open(self, config: NodeConfig, ingress_id: str) -> IngressService:
        return IngressService.open(
            config.ingress_db or "default", config.home, ingress_id,
            open_access=config.open_access, admin_token=config.admin_token,
            visibility=config.visibility,
            batch_max_file_bytes=min(config.batch_max_file_bytes, config.max_body_bytes),
            batch_runner=RunnerSettings(per_batch=config.batch_concurrency,
                                        per_ingress=config.batch_in_flight),
            internal_secret=node_secret(config.home), sso=sso_settings(config),
            log_prompts=config.log_prompts, usage_retention=config.usage_retention,
            priority_classes=tuple(config.priority_classes),
            default_priority=config.default_priority)

    def install(self, api: FastAPI, service: Any) -> None:
        install_dashboard(api)
        if not isinstance(service, IngressService) or service.sso is None:
            install_no_sso(api)
        if isinstance(service, IngressService):
            admin_api.install(api, service)
            batch_api.install(api, service)
            visibility.install(api, service.audience)
            if service.sso is not None:
                from ingress.sso import own_keys
                from ingress.sso.routes import install as install_sso

                install_sso(api, service.db, service.sso)
                own_keys.install(api, service.db, service.sso, service.ingress_id,
                                 service.changed_keys)


SERVICE = Plugin()

