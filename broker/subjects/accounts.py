"""With auth on: what one account reaches of another through imports, and reply inboxes."""

from __future__ import annotations

from .tokens import token


class AccountNames:
    """The API prefixes one fabric's accounts import each other's JetStream under."""

    __slots__ = ()
    prefix: str

    def fleet_api(self) -> str:
        """JetStream API prefix under which a tenant's account reaches the adverts bucket.

        The FABRIC account exports reads of the adverts bucket; each tenant's account imports
        them under this prefix (its own `$JS.API` is its own JetStream).
        """
        return f"$VF.{self.prefix}.fleet.API"

    def tenant_api(self, tenant: str) -> str:
        """JetStream API prefix under which the workers reach one tenant's account.

        The tenant's account exports the few calls workers make (pull, job spec, code and
        output reads and puts); the FABRIC account imports them under this prefix.
        """
        return f"$VF.{self.prefix}.{token(tenant, 'tenant')}.API"

    @staticmethod
    def is_inbox(reply: str) -> bool:
        """Whether a reply subject is an asker's inbox (its own, or `_R_.`: server-made).

        A request that crossed from another account arrives with a reply the server made,
        which leads back to the asker's account only.
        """
        return reply.startswith(("_INBOX.", "_INBOX_", "_R_."))

    @staticmethod
    def inbox_prefix(user: str) -> str:
        """The reply-inbox prefix of a user: its replies cannot be read by another user."""
        return f"_INBOX_{token(user, 'user')}"
