// The header every page of webgrad's site shows: links to the playground, the surprisal page,
// the chat page and the notebooks (/lab/, JupyterLite, which keeps its own UI). The one list
// of pages: a page imports this module and gets <nav id="site-nav"> as its body's first child,
// its own entry marked aria-current="page". Links are relative, so the site works under any
// path prefix.

export const PAGES = [
  ["index.html", "Playground"],
  ["surprisal.html", "Surprisal"],
  ["chat.html", "Chat & fine-tune"],
  ["lab/", "Notebooks"],
];

export function addNav(doc = document) {
  const here = doc.location.pathname.split("/").pop() || "index.html";
  const nav = doc.createElement("nav");
  nav.id = "site-nav";
  nav.setAttribute("aria-label", "webgrad pages");
  for (const [href, label] of PAGES) {
    const a = Object.assign(doc.createElement("a"), { href, textContent: label });
    if (href === here) a.setAttribute("aria-current", "page");
    nav.append(a);
  }
  doc.body.prepend(nav);
  return nav;
}

if (document.body) addNav();
else document.addEventListener("DOMContentLoaded", () => addNav(), { once: true });
