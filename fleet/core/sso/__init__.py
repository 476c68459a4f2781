"""Single sign-on: OIDC (:mod:`.oidc`) and LDAP (:mod:`.ldap`) sign-in, the group map that
turns an identity provider's groups into fleet roles and team memberships (:mod:`.mapping`,
pure), and the writes that apply it (:mod:`.sync`). See ``docs/sso.md``."""
