package pgjournal.jdbc;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.PosixFileAttributes;
import java.nio.file.attribute.PosixFilePermission;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Properties;
import java.util.Set;

import org.postgresql.plugin.AuthenticationPlugin;
import org.postgresql.plugin.AuthenticationRequestType;
import org.postgresql.util.PSQLException;
import org.postgresql.util.PSQLState;

/**
 * PgJDBC's password source (property {@code authenticationPluginClassName}) for a connection that must
 * authenticate by SCRAM only, as libpq's {@code require_auth=scram-sha-256}: PgJDBC before 42.7 ignores
 * {@code requireAuth} and answers a request for a clear-text or MD5 password from whatever holds the port.
 * The driver asks this class for the password once the server has said how it wants it; any way but SASL
 * (SCRAM, where the password never leaves the client) is refused before anything is sent.
 *
 * <p>The password is the connection's {@code password} property, else the line of the libpq password file
 * named by property {@value #PASSFILE} that matches the connection's host, port, database and user.
 * PgJDBC builds a plugin per authentication through its {@code Properties} constructor.
 */
public final class ScramOnly implements AuthenticationPlugin {
    /** The connection property naming the libpq password file. */
    public static final String PASSFILE = "pgjournalPassfile";

    private static final Set<PosixFilePermission> OTHERS = EnumSet.of(
            PosixFilePermission.GROUP_READ, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE,
            PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE);

    private final Properties info;

    public ScramOnly(Properties info) {
        this.info = info;
    }

    @Override
    public char[] getPassword(AuthenticationRequestType type) throws PSQLException {
        if (type != AuthenticationRequestType.SASL) {
            throw refused("the server at " + where() + " asked for the password " + how(type)
                    + "; only SCRAM-SHA-256 may have it (require_auth=scram-sha-256), so none was sent."
                    + " Another process may hold the port while the server is down");
        }
        String password = info.getProperty("password");
        if (password != null && !password.isEmpty()) {
            return password.toCharArray();
        }
        String passfile = info.getProperty(PASSFILE);
        if (passfile == null || passfile.isEmpty()) {
            throw refused("no password for " + where() + ": neither property password nor " + PASSFILE + " is set");
        }
        return fromPassfile(Paths.get(passfile));
    }

    private static String how(AuthenticationRequestType type) {
        switch (type) {
            case CLEARTEXT_PASSWORD:
                return "in clear text";
            case MD5_PASSWORD:
                return "as an MD5 hash";
            case GSS:
                return "for GSSAPI/SSPI";
            default:
                return "by " + type;
        }
    }

    private String where() {
        return info.getProperty("PGHOST", "?") + ":" + info.getProperty("PGPORT", "?");
    }

    private static PSQLException refused(String why) {
        return new PSQLException("pgjournal: " + why, PSQLState.INVALID_AUTHORIZATION_SPECIFICATION);
    }

    /** As libpq: a plain file no one but its owner can read or write, the first matching line, '*' any value. */
    private char[] fromPassfile(Path path) throws PSQLException {
        List<String> lines;
        try {
            PosixFileAttributes attributes = Files.readAttributes(path, PosixFileAttributes.class);
            if (!attributes.isRegularFile()) {
                throw refused("password file " + path + " is not a plain file");
            }
            Set<PosixFilePermission> open = EnumSet.copyOf(attributes.permissions());
            open.retainAll(OTHERS);
            if (!open.isEmpty()) {
                throw refused("password file " + path + " has group or world access; permissions should be"
                        + " u=rw (0600) or less");
            }
            lines = Files.readAllLines(path, StandardCharsets.UTF_8);
        } catch (IOException | UnsupportedOperationException e) {
            throw refused("cannot read password file " + path + " (" + e + ")");
        }
        String[] hosts = info.getProperty("PGHOST", "localhost").split(",", -1);
        String[] ports = info.getProperty("PGPORT", "5432").split(",", -1);
        String user = info.getProperty("user", "");
        String database = info.getProperty("PGDBNAME", user);
        for (String line : lines) {
            if (line.isEmpty() || line.startsWith("#")) {
                continue;
            }
            List<String> fields = fields(line);
            if (fields.size() != 5) {
                continue;
            }
            boolean at = false;
            for (int i = 0; i < hosts.length; i++) {
                String port = ports.length == hosts.length ? ports[i] : ports[0];
                at |= matches(fields.get(0), hosts[i]) && matches(fields.get(1), port);
            }
            if (at && matches(fields.get(2), database) && matches(fields.get(3), user)) {
                return fields.get(4).toCharArray();
            }
        }
        throw refused("password file " + path + " has no line for " + where() + ", database " + database
                + ", user " + user);
    }

    private static boolean matches(String field, String value) {
        return field.equals("*") || field.equals(value);
    }

    /** hostname:port:database:username:password, a backslash escaping the next character. */
    private static List<String> fields(String line) {
        List<String> fields = new ArrayList<>();
        StringBuilder current = new StringBuilder();
        for (int i = 0; i < line.length(); i++) {
            char c = line.charAt(i);
            if (c == '\\' && i + 1 < line.length()) {
                current.append(line.charAt(++i));
            } else if (c == ':' && fields.size() < 4) {
                fields.add(current.toString());
                current.setLength(0);
            } else {
                current.append(c);
            }
        }
        fields.add(current.toString());
        return fields;
    }
}
