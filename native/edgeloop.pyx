# cython: language_level=3
"""The edge's connection loop: the compiled twin of ``chaingate/_pure/edgeloop.py``.

The pure module is the specification (read its docstring first); this one behaves the same
for every sequence of events (tests/test_edgeloop.py drives both).  It differs in how: the
loop owns raw file descriptors and calls epoll, recv and sendmsg itself; a connection is a
typed object; the read buffer is the loop's own.
"""

import logging

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.errno cimport EAGAIN, EINTR, errno
from libc.string cimport memset

log = logging.getLogger("chaingate.edge")

__all__ = ["IMPLEMENTATION", "Conn", "Loop"]

IMPLEMENTATION = "compiled"

from chaingate.framing_constants import BUSY as _BUSY
from chaingate.framing_constants import CLOSED as _CLOSED
from chaingate.framing_constants import IDLE as _IDLE
from chaingate.framing_constants import JSON_HEADERS as _JSON_HEADERS
from chaingate.framing_constants import LINGER as _LINGER
from chaingate.framing_constants import READING as _READING
from chaingate.framing_constants import UPGRADED as _UPGRADED
from chaingate.framing_constants import WRITING as _WRITING

cdef int IDLE = _IDLE
cdef int READING = _READING
cdef int BUSY = _BUSY
cdef int WRITING = _WRITING
cdef int LINGER = _LINGER
cdef int UPGRADED = _UPGRADED
cdef int CLOSED = _CLOSED

cdef extern from "sys/epoll.h" nogil:
    ctypedef union epoll_data_t:
        void *ptr
        int fd
        unsigned int u32
        unsigned long long u64
    cdef struct epoll_event:
        unsigned int events
        epoll_data_t data
    int epoll_create1(int flags)
    int epoll_ctl(int epfd, int op, int fd, epoll_event *event)
    int epoll_wait(int epfd, epoll_event *events, int maxevents, int timeout)
    enum:
        EPOLLIN
        EPOLLOUT
        EPOLLET
        EPOLLRDHUP
        EPOLLERR
        EPOLLHUP
        EPOLL_CTL_ADD
        EPOLL_CTL_MOD
        EPOLL_CTL_DEL
        EPOLL_CLOEXEC

cdef extern from "sys/eventfd.h" nogil:
    int eventfd(unsigned int initval, int flags)
    enum:
        EFD_NONBLOCK
        EFD_CLOEXEC

cdef extern from "sys/uio.h" nogil:
    cdef struct iovec:
        void *iov_base
        size_t iov_len

cdef extern from "sys/socket.h" nogil:
    cdef struct msghdr:
        void *msg_name
        unsigned int msg_namelen
        iovec *msg_iov
        size_t msg_iovlen
        void *msg_control
        size_t msg_controllen
        int msg_flags
    ssize_t recv(int fd, void *buf, size_t n, int flags)
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    ssize_t sendmsg(int fd, const msghdr *msg, int flags)
    int shutdown(int fd, int how)
    int setsockopt(int fd, int level, int name, const void *value, unsigned int length)
    enum:
        MSG_NOSIGNAL
        MSG_PEEK
        MSG_DONTWAIT
        SHUT_WR

cdef extern from "netinet/in.h" nogil:
    enum: IPPROTO_TCP

cdef extern from "netinet/tcp.h" nogil:
    enum: TCP_QUICKACK

cdef int ONE = 1

cdef extern from "unistd.h" nogil:
    int close(int fd)
    ssize_t read(int fd, void *buf, size_t n)
    ssize_t write(int fd, const void *buf, size_t n)

cdef extern from "time.h" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk_id, timespec *tp)
    enum: CLOCK_MONOTONIC
    enum: CLOCK_REALTIME


cdef inline double monotonic() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


DEF RECV_SIZE = 65536
DEF MAX_EVENTS = 256
DEF LOOK_AGAIN = 2  # a readiness this large gets one more look (see the pure twin)
DEF MAX_IOV = 64
cdef int FAIRNESS_BATCH = 64
cdef Py_ssize_t FLUSH_BYTES = 256 << 10
cdef Py_ssize_t LARGE_BODY = 64 << 10
cdef Py_ssize_t LINGER_MAX_BYTES = 8 << 20
cdef bytes CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
cdef bytes JSON = _JSON_HEADERS
cdef bytes OVERLOADED_HEADERS = JSON + b"Retry-After: 1\r\n"
cdef str INTERNAL_ERROR = "internal error; retry with exponential backoff"
cdef str HANDOFF = "handoff"
cdef enum:
    KEEP = 0
    CLOSE = 1
    DRAIN = 2

# Writability is watched only once an answer did not fit in the kernel (see the pure twin).
cdef unsigned int EPOLL_FLAGS = EPOLLIN | EPOLLRDHUP | EPOLLET
cdef unsigned int EPOLL_WRITING = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET
cdef unsigned int HANGUP = EPOLLRDHUP | EPOLLHUP | EPOLLERR


cdef class Conn:
    """One client connection as the loop keeps it."""

    cdef public int fd
    cdef public str peer
    cdef public str group
    cdef public object parser
    cdef public int state
    cdef public double since
    cdef list out
    cdef public Py_ssize_t unsent
    cdef public object request
    cdef bint asked_keep_alive
    cdef public int auth_failures
    cdef public bint eof
    cdef public bint ready
    cdef public int after
    cdef Py_ssize_t drained
    cdef bint watching
    cdef bint hangup


cdef class Loop:
    """Every connection of the edge, and what happens when they are ready."""

    cdef object _http1
    cdef object _http_error
    cdef object _build_response
    cdef object _build_response_head
    cdef object _lane
    cdef object _serve
    cdef tuple _limits
    cdef Py_ssize_t _max_unsent
    cdef int _max_auth_failures
    cdef Py_ssize_t _compress_min
    cdef object _budget
    cdef object _date
    cdef object _error_body
    cdef object _handoff
    cdef object _encode
    cdef object _closed
    cdef int _epfd
    cdef int _wake
    cdef public dict conns
    cdef list _again
    cdef bint _polling
    cdef public bint closing
    cdef public Py_ssize_t unsent_bytes
    cdef public long long overloaded
    cdef public dict framing_errors
    cdef char _buffer[RECV_SIZE]
    cdef long long _date_second
    cdef bytes _date_bytes

    def __init__(self, http1, lane, *, tuple limits, Py_ssize_t max_unsent_bytes,
                 int max_auth_failures, Py_ssize_t compress_min, budget, date, error_body,
                 handoff, encode, closed):
        cdef epoll_event event
        self._http1 = http1
        self._http_error = http1.HttpError
        self._build_response = http1.build_response
        self._build_response_head = http1.build_response_head
        self._lane = lane
        self._serve = lane.serve
        self._limits = limits
        self._max_unsent = max_unsent_bytes
        self._max_auth_failures = max_auth_failures
        self._compress_min = compress_min
        self._budget = budget
        self._date = date
        self._date_second = -1
        self._date_bytes = b""
        self._error_body = error_body
        self._handoff = handoff
        self._encode = encode
        self._closed = closed
        self._epfd = epoll_create1(EPOLL_CLOEXEC)
        if self._epfd < 0:
            raise OSError(errno, "epoll_create1 failed")
        self._wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self._wake < 0:
            raise OSError(errno, "eventfd failed")
        memset(&event, 0, sizeof(event))
        event.events = EPOLLIN
        event.data.fd = self._wake
        epoll_ctl(self._epfd, EPOLL_CTL_ADD, self._wake, &event)
        self.conns = {}
        self._again = []
        self._polling = False
        self.closing = False
        self.unsent_bytes = 0
        self.overloaded = 0
        self.framing_errors = {}
        lane.sink = self

    def fileno(self):
        return self._epfd

    def close_loop(self):
        for conn in list(self.conns.values()):
            self.close(conn)
        if self._epfd >= 0:
            close(self._epfd)
            close(self._wake)
            self._epfd = -1

    cdef inline bytes _date_line(self):
        """The Date header line, formatted by ``date`` once per second."""
        cdef timespec ts
        clock_gettime(CLOCK_REALTIME, &ts)
        if ts.tv_sec != self._date_second:
            self._date_second = ts.tv_sec
            self._date_bytes = self._date.line()
        return self._date_bytes

    cdef void _schedule(self, Conn conn) except *:
        cdef unsigned long long one = 1
        if not self._again and not self._polling:
            write(self._wake, &one, 8)
        self._again.append(conn)

    # --- connections ----------------------------------------------------------------------

    def register(self, sock, str peer, str group):
        cdef epoll_event event
        line, header_bytes, headers, body = self._limits
        cdef Conn conn = Conn.__new__(Conn)
        conn.parser = self._http1.RequestParser(line, header_bytes, headers, body)
        conn.fd = sock.detach()  # the loop owns the descriptor from now on
        conn.peer = peer
        conn.group = group
        conn.state = IDLE
        conn.since = monotonic()
        conn.out = []
        conn.unsent = 0
        conn.request = None
        conn.asked_keep_alive = True
        conn.auth_failures = 0
        conn.eof = False
        conn.ready = False
        conn.after = KEEP
        conn.drained = 0
        conn.watching = False
        conn.hangup = False
        self.conns[conn.fd] = conn
        memset(&event, 0, sizeof(event))
        event.events = EPOLL_FLAGS
        event.data.fd = conn.fd
        if epoll_ctl(self._epfd, EPOLL_CTL_ADD, conn.fd, &event) < 0:
            del self.conns[conn.fd]
            close(conn.fd)
            raise OSError(errno, "epoll_ctl failed")
        return conn

    cpdef close(self, Conn conn):
        if conn.state == CLOSED or conn.state == UPGRADED:
            return
        conn.state = CLOSED
        self._forget(conn)
        close(conn.fd)
        self._closed(conn)

    cdef void _forget(self, Conn conn) except *:
        self.conns.pop(conn.fd, None)
        if conn.unsent:
            self.unsent_bytes -= conn.unsent
            conn.unsent = 0
            conn.out = []
        epoll_ctl(self._epfd, EPOLL_CTL_DEL, conn.fd, NULL)

    def timeout(self, Conn conn, int status, str message):
        if conn.state == CLOSED or conn.state == UPGRADED:
            return
        body = self._error_body(status, message)
        headers = self._note(conn, None, status, len(body)) + JSON
        cdef bytes response = self._build_response(status, self._date_line() + headers, body, False)
        send(conn.fd, PyBytes_AS_STRING(response), PyBytes_GET_SIZE(response), MSG_NOSIGNAL)
        self.close(conn)

    def detach(self, Conn conn):
        if conn.state != BUSY or conn.out:
            return None
        self._forget(conn)
        conn.state = UPGRADED
        return conn.fd, conn.parser.take_buffered()

    cpdef bint idle(self, Conn conn):
        """Between requests, holding none the client already sent (see the pure twin)."""
        cdef char byte
        if conn.state != IDLE or conn.ready or conn.parser.has_partial:
            return False
        # Bytes no poll has seen yet (the loop stalled while they came): a request, not idle.
        return recv(conn.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) <= 0

    def begin_shutdown(self):
        self.closing = True
        for conn in list(self.conns.values()):
            if self.idle(conn):
                self.close(conn)

    # --- events ---------------------------------------------------------------------------

    def poll(self):
        self._polling = True
        try:
            return self._poll()
        finally:
            self._polling = False

    cdef bint _poll(self) except -1:
        cdef int n
        cdef Conn conn
        again = self._again
        self._again = []
        for conn in again:
            if conn.state == IDLE or conn.state == READING:
                self._resume(conn)
        n = self._serve_ready()
        if LOOK_AGAIN <= n < MAX_EVENTS:
            n = self._serve_ready()
        return n < 0 or len(self._again) > 0 or n == MAX_EVENTS

    cdef int _serve_ready(self) except -2:
        """Serve the connections ready now; how many events were seen (-1: interrupted)."""
        cdef epoll_event events[MAX_EVENTS]
        cdef int n, i, fd
        cdef unsigned int mask
        cdef unsigned long long counter
        cdef Conn conn
        n = epoll_wait(self._epfd, events, MAX_EVENTS, 0)
        if n < 0:
            if errno == EINTR:
                return -1
            raise OSError(errno, "epoll_wait failed")
        conns = self.conns
        for i in range(n):
            fd = events[i].data.fd
            mask = events[i].events
            conn_obj = conns.get(fd)
            if conn_obj is None:
                if fd == self._wake:
                    read(self._wake, &counter, 8)
                continue
            conn = <Conn>conn_obj
            if mask & EPOLLOUT and conn.out:
                self._write(conn)
            if mask & HANGUP:
                # The end of stream may have come with the last bytes (see the pure twin).
                conn.hangup = True
                conn.ready = True
            if mask & ~(<unsigned int>EPOLLOUT):
                state = conn.state
                if state == IDLE or state == READING:
                    self._read(conn)
                elif state == LINGER:
                    self._drain(conn)
                elif state != CLOSED:
                    conn.ready = True
        return n

    cdef void _read(self, Conn conn) except *:
        cdef ssize_t got = recv(conn.fd, self._buffer, RECV_SIZE, 0)
        while got < 0 and errno == EINTR:
            got = recv(conn.fd, self._buffer, RECV_SIZE, 0)
        if got < 0:
            if errno == EAGAIN:
                conn.ready = False
                self._process(conn)
                return
            self.close(conn)
            return
        if got > 0:
            conn.parser.feed(PyBytes_FromStringAndSize(self._buffer, got))
            conn.ready = got == RECV_SIZE or conn.hangup
        else:
            conn.eof = True
            conn.ready = False
            conn.parser.feed_eof()
        self._process(conn)
        if conn.ready and (conn.state == IDLE or conn.state == READING):
            self._schedule(conn)

    cdef void _process(self, Conn conn) except *:
        parser = conn.parser
        cdef int answered = 0
        cdef int status
        while (conn.state == IDLE or conn.state == READING) and conn.after == KEEP:
            request = parser.next_event()
            if request is None:
                if conn.eof:
                    conn.after = CLOSE
                elif parser.has_partial:
                    if parser.take_continue():
                        self._queue(conn, CONTINUE)
                    if conn.state != READING:
                        conn.state = READING
                        conn.since = monotonic()
                    # The rest of the request is on its way: ACK now (see the pure twin).
                    setsockopt(conn.fd, IPPROTO_TCP, TCP_QUICKACK, &ONE, sizeof(int))
                elif self.closing:
                    conn.after = CLOSE
                elif conn.state != IDLE:
                    conn.state = IDLE
                    conn.since = monotonic()
                break
            if isinstance(request, self._http_error):
                status = request.status
                self.framing_errors[status] = self.framing_errors.get(status, 0) + 1
                if conn.eof:
                    conn.after = CLOSE
                    break
                body = self._error_body(status, request.message)
                headers = self._note(conn, None, status, len(body)) + JSON
                self._queue(conn, self._build_response(status, self._date_line() + headers, body, False))
                conn.after = DRAIN
                break
            conn.request = request
            conn.asked_keep_alive = request.keep_alive
            conn.state = BUSY
            answer = self._dispatch(conn, request)
            if answer is None:
                break
            status = (<tuple>answer)[0]
            headers = (<tuple>answer)[1]
            body = (<tuple>answer)[2]
            if self._wants_coding(request, body):
                self._encode(conn, status, headers, body)
                break
            self._frame(conn, request, status, headers, body)
            answered += 1
            if conn.after != KEEP or conn.unsent >= FLUSH_BYTES:
                break
            if answered >= FAIRNESS_BATCH:
                self._schedule(conn)
                break
        self._flush(conn)

    cdef object _dispatch(self, Conn conn, request):
        budget = self._budget
        if self.unsent_bytes > self._max_unsent or budget.held >= budget.limit:
            self.overloaded += 1
            body = self._error_body(503, "server overloaded: retry shortly")
            return 503, self._note(conn, request, 503, len(body)) + OVERLOADED_HEADERS, body
        if request.content_encoding is None and request.upgrade is None:
            try:
                answer = self._serve(conn, request, conn.peer, conn.group)
            except Exception:
                log.exception("unhandled error in the fast lane")
                request.keep_alive = False
                body = self._error_body(500, INTERNAL_ERROR)
                return 500, self._note(conn, request, 500, len(body)) + JSON, body
            if type(answer) is tuple:
                return answer
            if answer != HANDOFF:
                return None  # deferred: the lane delivers it
        self._handoff(conn, request)
        return None

    cdef bytes _note(self, Conn conn, request, int status, Py_ssize_t size):
        lane = self._lane
        request_id = lane.ids.take(request.request_id if request is not None else None)
        method = request.method if request is not None else b"-"
        path = lane.log_path(request.path) if request is not None else "-"
        lane.ledger.note("other", status, request_id, conn.peer, method, path, monotonic(), size,
                         "", b"")
        return b"X-Request-Id: " + request_id + b"\r\n"

    cdef bint _wants_coding(self, request, bytes body) except -1:
        accept = request.accept_encoding
        cdef Py_ssize_t size = PyBytes_GET_SIZE(body)
        return (
            accept is not None
            and self._compress_min > 0
            and size > 0
            and (size >= self._compress_min or b"=0" in accept)
        )

    # --- answers --------------------------------------------------------------------------

    def deliver(self, Conn conn, request, int status, bytes headers, bytes body):
        if conn.state != BUSY or conn.request is not request:
            return
        if self._wants_coding(conn.request, body):
            self._encode(conn, status, headers, body)
            return
        self.answer(conn, status, headers, body)

    cpdef answer(self, Conn conn, int status, bytes headers, bytes body):
        if conn.state != BUSY:
            return
        self._frame(conn, conn.request, status, headers, body)
        if conn.unsent >= FLUSH_BYTES:
            self._flush(conn)
        if conn.state == IDLE:
            self._resume(conn)

    cdef void _resume(self, Conn conn) except *:
        if conn.ready and conn.after == KEEP:
            self._read(conn)
        else:
            self._process(conn)

    cdef void _frame(self, Conn conn, request, int status, bytes headers, bytes body) except *:
        if status == 401:
            conn.auth_failures += 1
            if conn.auth_failures >= self._max_auth_failures:
                request.keep_alive = False
        cdef bint keep_alive = request.keep_alive and not self.closing
        cdef bint http10 = request.version == 10
        cdef Py_ssize_t size = PyBytes_GET_SIZE(body)
        cdef bint has_content = size > 0 and status >= 200 and status != 204 and status != 304
        cdef bytes response
        headers = self._date_line() + headers
        if has_content and size >= LARGE_BODY:
            self._queue(conn, self._build_response_head(status, headers, size, keep_alive, http10))
            if request.method != b"HEAD":
                self._queue(conn, body)
        else:
            response = self._build_response(status, headers, body, keep_alive, http10)
            if has_content and request.method == b"HEAD":
                response = response[:PyBytes_GET_SIZE(response) - size]
            self._queue(conn, response)
        conn.request = None
        conn.state = IDLE
        conn.since = monotonic()  # idle from this answer on (the sweeper's clock)
        if not keep_alive:
            conn.after = DRAIN if conn.asked_keep_alive and not self.closing else CLOSE

    cdef inline void _queue(self, Conn conn, bytes data) except *:
        conn.out.append(data)
        conn.unsent += PyBytes_GET_SIZE(data)
        self.unsent_bytes += PyBytes_GET_SIZE(data)

    cdef Py_ssize_t _send_out(self, Conn conn) except -2:
        """Hand the kernel what is queued, MAX_IOV pieces per sendmsg, until it is all taken
        or the kernel leaves some (EPOLLOUT then says when it has room): the bytes taken, or
        -1 when the connection broke (and is closed)."""
        cdef iovec iov[MAX_IOV]
        cdef msghdr message
        cdef Py_ssize_t count, offered, total = 0
        cdef ssize_t sent
        cdef bytes part
        while conn.out:
            count = 0
            offered = 0
            for part in conn.out:
                if count == MAX_IOV:
                    break
                iov[count].iov_base = PyBytes_AS_STRING(part)
                iov[count].iov_len = PyBytes_GET_SIZE(part)
                offered += PyBytes_GET_SIZE(part)
                count += 1
            memset(&message, 0, sizeof(message))
            message.msg_iov = iov
            message.msg_iovlen = count
            sent = sendmsg(conn.fd, &message, MSG_NOSIGNAL)
            if sent < 0:
                if errno == EINTR:
                    continue
                if errno == EAGAIN:
                    return total
                self.close(conn)
                return -1
            self._sent(conn, sent)
            total += sent
            if sent < offered:
                return total  # the kernel is full: EPOLLOUT says when it has room
        return total

    cdef void _flush(self, Conn conn) except *:
        cdef epoll_event event
        if conn.out:
            if self._send_out(conn) < 0:
                return
            if conn.out:
                if not conn.watching:
                    conn.watching = True
                    memset(&event, 0, sizeof(event))
                    event.events = EPOLL_WRITING
                    event.data.fd = conn.fd
                    epoll_ctl(self._epfd, EPOLL_CTL_MOD, conn.fd, &event)
                if conn.state != WRITING and conn.state != BUSY:
                    conn.state = WRITING
                    conn.since = monotonic()
                return
        if conn.state != BUSY:
            self._written(conn)

    cdef void _write(self, Conn conn) except *:
        if self._send_out(conn) < 0:
            return
        if conn.out or conn.state != WRITING:
            return
        conn.state = IDLE
        conn.since = monotonic()
        self._written(conn)
        if conn.state == IDLE:
            self._resume(conn)

    cdef void _sent(self, Conn conn, Py_ssize_t sent) except *:
        cdef bytes first
        cdef Py_ssize_t size
        conn.unsent -= sent
        self.unsent_bytes -= sent
        out = conn.out
        cdef Py_ssize_t whole = 0
        while sent and whole < len(out):
            first = out[whole]
            size = PyBytes_GET_SIZE(first)
            if sent >= size:
                sent -= size
                whole += 1
            else:
                out[whole] = first[sent:]
                sent = 0
        if whole:
            del out[:whole]

    cdef void _written(self, Conn conn) except *:
        if conn.after == CLOSE:
            self.close(conn)
        elif conn.after == DRAIN:
            self._linger(conn)

    cdef void _linger(self, Conn conn) except *:
        conn.state = LINGER
        conn.since = monotonic()
        if shutdown(conn.fd, SHUT_WR) < 0:
            self.close(conn)
            return
        self._drain(conn)

    cdef void _drain(self, Conn conn) except *:
        cdef ssize_t got
        while True:
            got = recv(conn.fd, self._buffer, RECV_SIZE, 0)
            if got < 0:
                if errno == EINTR:
                    continue
                if errno == EAGAIN:
                    return
                got = 0
            if got == 0 or conn.drained + got > LINGER_MAX_BYTES:
                self.close(conn)
                return
            conn.drained += got
