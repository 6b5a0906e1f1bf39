"""`clover serve`: an OpenAI-compatible HTTP server over one `Clover`, with a chat page at `/`.

`schemas` holds the request bodies (OpenAI's fields plus Clover's settings), `worker` the one
thread that runs requests in order from a bounded queue, `app` the FastAPI routes, and `static/`
the page (plain HTML, CSS and JavaScript: no CDN, no build step). Needs the `server` extra.
"""
