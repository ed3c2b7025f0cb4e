// Search for the site opened from the file system (site/index.html): browsers give a page at file://
// neither a web worker nor the index file by XMLHttpRequest, so MkDocs' own search never gets past
// "Searching...". There, this script loads the same index as a script (search/search_index.js, written
// by docs/hooks.py next to search_index.json) and answers the search page itself: every page that holds
// all the words of the query, titles first, each with the text around its first match.
(function () {
  "use strict";
  if (window.location.protocol !== "file:") {
    return; // served over HTTP (mkdocs serve, a web server): MkDocs' search works
  }

  function escapeHtml(text) {
    return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }

  function queryFromLocation() {
    var match = /[?&]q=([^&]*)/.exec(window.location.search);
    return match ? decodeURIComponent(match[1].replace(/\+/g, " ")) : "";
  }

  function rootUrl(path) {
    var base = typeof base_url === "string" ? base_url : ".";
    return base.replace(/\/$/, "") + "/" + path;
  }

  function snippet(text, word) {
    var at = text.toLowerCase().indexOf(word);
    var start = Math.max(0, at - 80);
    return (start > 0 ? "…" : "") + text.substr(start, 240) + (start + 240 < text.length ? "…" : "");
  }

  function search(docs, query) {
    var words = query.toLowerCase().split(/\s+/).filter(function (w) { return w.length > 1; });
    if (!words.length) {
      return [];
    }
    var found = [];
    docs.forEach(function (doc) {
      var title = (doc.title || "").toLowerCase(), text = (doc.text || "").toLowerCase();
      var score = 0;
      for (var i = 0; i < words.length; i++) {
        var inTitle = title.indexOf(words[i]) >= 0, inText = text.indexOf(words[i]) >= 0;
        if (!inTitle && !inText) {
          return;
        }
        score += (inTitle ? 10 : 0) + (inText ? 1 : 0);
      }
      found.push({doc: doc, score: score, word: words[0]});
    });
    found.sort(function (a, b) { return b.score - a.score; });
    return found.slice(0, 50);
  }

  function show(results) {
    var box = document.getElementById("mkdocs-search-results");
    if (!results.length) {
      box.innerHTML = "<p>" + escapeHtml(box.getAttribute("data-no-results-text") || "No results found") + "</p>";
      return;
    }
    box.innerHTML = results.map(function (r) {
      return "<article><h3><a href=\"" + escapeHtml(rootUrl(r.doc.location)) + "\">" + escapeHtml(r.doc.title) +
        "</a></h3><p>" + escapeHtml(snippet(r.doc.text || "", r.word)) + "</p></article>";
    }).join("");
  }

  function start() {
    var box = document.getElementById("mkdocs-search-results");
    var input = document.getElementById("mkdocs-search-query");
    if (!box || !input) {
      return; // not the search page: its form sends the query there
    }
    var script = document.createElement("script");
    script.src = rootUrl("search/search_index.js");
    script.onload = function () {
      var docs = (window.FEDJAX_PFL_SEARCH_INDEX || {}).docs || [];
      input.value = input.value || queryFromLocation();
      show(search(docs, input.value));
      input.addEventListener("input", function () { show(search(docs, input.value)); });
    };
    script.onerror = function () {
      box.innerHTML = "<p>The search index (search/search_index.js) is missing: rebuild the site.</p>";
    };
    document.head.appendChild(script);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
