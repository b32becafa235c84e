"""The workflows' prompt texts as jinja2 templates.

The shipped ones are in `envs/prompts/<family>/` (family: grid, math, code). A workflow's `prompt_dir=DIR`
(`--config.env.kwargs.prompt_dir=DIR`) puts DIR/<family>/<name>.j2 in place of the shipped template of that
name, any number of them, so a run can use other wording (the reference system's own prompts, say)
without a fork; `python -m atgrpo_jax.envs.prompt_templates DIR` copies the shipped ones there to start
from. Each template's header comment lists the values it is given.
"""
from __future__ import annotations

import os
import shutil
import sys

import jinja2

SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts")


class Prompts:
    """The templates of one family, each DIR/<family>/<name> replacing the shipped one (DIR "" : none)."""

    def __init__(self, family: str, override: str = ""):
        self.family, self.override = family, override
        shipped = os.path.join(SHIPPED, family)
        loaders = [jinja2.FileSystemLoader(shipped)]
        if override:
            mine = os.path.join(override, family)
            if not os.path.isdir(override):
                raise ValueError(f"env.kwargs.prompt_dir: {override!r} is not a directory")
            known = set(os.listdir(shipped))
            stray = sorted(set(os.listdir(mine)) - known) if os.path.isdir(mine) else []
            if stray:
                raise ValueError(f"env.kwargs.prompt_dir: {mine} has {stray}, which replace no template of "
                                 f"{family}; its templates: {', '.join(sorted(known))}")
            loaders.insert(0, jinja2.FileSystemLoader(mine))
        # StrictUndefined: a template naming a value it is not given fails, rather than saying nothing
        self._env = jinja2.Environment(loader=jinja2.ChoiceLoader(loaders), undefined=jinja2.StrictUndefined,
                                       trim_blocks=True, lstrip_blocks=True, auto_reload=False,
                                       autoescape=False)
        for name in sorted(os.listdir(shipped)):  # every template parses now, not at the first rollout
            self._template(name)

    def _where(self, name: str) -> str:
        mine = os.path.join(self.override, self.family, name) if self.override else ""
        return mine if mine and os.path.exists(mine) else os.path.join(SHIPPED, self.family, name)

    def _template(self, name: str) -> jinja2.Template:
        try:
            return self._env.get_template(name)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"prompt template {self._where(name)}, line {e.lineno}: {e.message}") from None

    def render(self, name: str, **values) -> str:
        """Template `name` (e.g. "user.j2") filled with `values`."""
        try:
            return self._template(name).render(**values)
        except jinja2.UndefinedError as e:
            raise ValueError(f"prompt template {self._where(name)}: {e.message}; it is given "
                             f"{', '.join(sorted(values))}") from None


    def chat(self, system: str, user: str, **values) -> list[dict[str, str]]:
        """The messages of a prompt: template `<system>.system.j2` (filled with `values`), then `user`; a
        system template that renders to blank space gives no system message (the reference's prompts are one
        user message, docs/paper.md "Recipes", row 12)."""
        content = self.render(f"{system}.system.j2", **values)
        head = [{"role": "system", "content": content}] if content.strip() else []
        return head + [{"role": "user", "content": user}]


def copy_shipped(out: str) -> list[str]:
    """Copy the shipped templates to out/<family>/ (existing files are kept); returns the paths written."""
    written = []
    for family in sorted(os.listdir(SHIPPED)):
        os.makedirs(os.path.join(out, family), exist_ok=True)
        for name in sorted(os.listdir(os.path.join(SHIPPED, family))):
            target = os.path.join(out, family, name)
            if not os.path.exists(target):
                shutil.copyfile(os.path.join(SHIPPED, family, name), target)
                written.append(target)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m atgrpo_jax.envs.prompt_templates DIR  (copies the shipped templates to DIR)")
    for path in copy_shipped(sys.argv[1]):
        print(path)
