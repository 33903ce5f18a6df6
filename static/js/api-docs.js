// The API docs page: Swagger UI over the generated schema. "Try it out" from a logged-in browser sends the
// session cookie; changes also need the CSRF token, added here to every request.
(function () {
  const holder = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: holder.dataset.schema,
    dom_id: "#swagger-ui",
    deepLinking: true,
    requestInterceptor: function (request) {
      request.headers["X-CSRFToken"] = holder.dataset.csrf;
      return request;
    },
  });
})();
