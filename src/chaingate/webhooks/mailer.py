"""The e-mail that tells a webhook's owner it was paused, and the SMTP client that sends it.

``smtplib`` blocks, so each message goes out from a worker thread.  The thread is abandoned if
the caller is cancelled (shutdown); its sockets carry ``SmtpSettings.timeout``, so it ends on
its own soon after.  ``smtps://`` speaks TLS from the first byte; ``smtp://`` upgrades with
STARTTLS when the server offers it and ``starttls`` is on.  The password is sent only over an
encrypted connection (or to a server on loopback) and never appears in an error or a log.
"""

from __future__ import annotations

import ipaddress
import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from urllib.parse import urlsplit

import trio

from chaingate.config import SmtpSettings
from chaingate.printable import url_shown

DEFAULT_PORTS = {"smtp": 25, "smtps": 465}


class MailError(Exception):
    """A message was not sent; the text says why (never with the password)."""


class Mailer:
    """Sends plain-text messages through the server ``settings.url`` names.

    ``ssl_context``: the certificates to trust (default: the system's, with host names
    checked); tests and operators with a private CA pass their own.
    """

    def __init__(
        self, settings: SmtpSettings, *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        parts = urlsplit(settings.url)
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS or not parts.hostname:
            raise ValueError("the SMTP url is smtp://host[:port] or smtps://host[:port]")
        try:
            port = parts.port
        except ValueError:
            raise ValueError("the SMTP url has an invalid port") from None
        self._settings = settings
        self._implicit_tls = scheme == "smtps"
        self._host = parts.hostname
        self._port = port or DEFAULT_PORTS[scheme]
        self._ssl_context = ssl_context

    def __repr__(self) -> str:
        scheme = "smtps" if self._implicit_tls else "smtp"
        return f"<Mailer {scheme}://{self._host}:{self._port}>"

    def compose(self, to: str, subject: str, text: str) -> EmailMessage:
        """The message; ValueError for a header that would inject another (CR or LF)."""
        message = EmailMessage()
        message["From"] = self._settings.sender
        message["To"] = to
        message["Subject"] = subject
        message["Date"] = formatdate(usegmt=True)
        # The sender's domain, not make_msgid's default: that one asks DNS for our own name.
        domain = self._settings.sender.rpartition("@")[2] or "localhost"
        message["Message-ID"] = make_msgid(domain=domain)
        message.set_content(text)
        return message

    async def send(self, to: str, subject: str, text: str) -> None:
        """Send one message; MailError if the server did not take it."""
        try:
            message = self.compose(to, subject, text)
        except ValueError as exc:
            raise MailError(f"message not composed: {exc}") from None
        await trio.to_thread.run_sync(self._send_blocking, message, abandon_on_cancel=True)

    def _context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    def _send_blocking(self, message: EmailMessage) -> None:
        settings = self._settings
        try:
            client: smtplib.SMTP
            if self._implicit_tls:
                client = smtplib.SMTP_SSL(
                    self._host, self._port, timeout=settings.timeout, context=self._context()
                )
            else:
                client = smtplib.SMTP(self._host, self._port, timeout=settings.timeout)
            with client:
                client.ehlo()
                encrypted = self._implicit_tls
                if not encrypted and settings.starttls and client.has_extn("starttls"):
                    client.starttls(context=self._context())
                    client.ehlo()
                    encrypted = True
                if settings.username:
                    if not encrypted and not _loopback(self._host):
                        raise MailError(
                            f"{self}: not sending the SMTP password over an unencrypted"
                            " connection (use smtps://, or a server that offers STARTTLS)"
                        )
                    client.login(settings.username, settings.password)
                client.send_message(message)
        except MailError:
            raise
        except (smtplib.SMTPException, OSError, ValueError) as exc:
            raise MailError(self._describe(exc)) from None

    def _describe(self, exc: Exception) -> str:
        """What went wrong, as the server or the socket said it — with the password (should
        a server ever echo it) masked."""
        text = f"{self}: {type(exc).__name__}: {exc}"
        if self._settings.password:
            text = text.replace(self._settings.password, "***")
        return text


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def pause_notice(webhook_id: str, url: str, reason: str) -> tuple[str, str]:
    """(subject, text) of the e-mail telling an owner their webhook was paused."""
    subject = f"Webhook {webhook_id} paused: its deliveries keep failing"
    text = (
        f"Your webhook {webhook_id} was paused.\n"
        f"\n"
        f"URL:    {url_shown(url)}\n"  # one stored before hidden characters were refused
        f"Reason: {reason}\n"
        f"\n"
        f"While it is paused nothing new is matched for it; events already waiting are kept\n"
        f"and sent once it is active again.  The delivery log\n"
        f"(GET /v1/webhooks/{webhook_id}/attempts) shows what your endpoint answered.\n"
        f"\n"
        f"When the endpoint works again, resume the webhook:\n"
        f"\n"
        f"    PATCH /v1/webhooks/{webhook_id}\n"
        f'    {{"status": "active"}}\n'
    )
    return subject, text
