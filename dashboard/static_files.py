"""WhiteNoise's static files middleware, able to run in the event loop as well as in a sync thread.

WhiteNoise 6's middleware is sync only. Under ASGI one sync-only middleware makes Django run the whole chain of
every request in a sync thread (the request's own: Django's ASGI handler gives each request a thread-sensitive
context), a thread hop per request that an async view such as /metrics does not need. Here, under ASGI, the
lookup of a static file is a dict read (or, with autorefresh in development, a look at the disk in a pool thread)
and everything else goes on to the next middleware in the event loop; under WSGI (the test client) it is
WhiteNoise's own __call__.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponseBase
from whitenoise.middleware import WhiteNoiseMiddleware


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    sync_capable = True
    async_capable = True

    def __init__(self, get_response, *args, **kwargs) -> None:
        super().__init__(get_response, *args, **kwargs)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        if self.autorefresh:
            static_file = await sync_to_async(self.find_file, thread_sensitive=False)(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is not None:  # opens the file: a pool thread, not the loop
            return await sync_to_async(self.serve, thread_sensitive=False)(static_file, request)
        return await self.get_response(request)
